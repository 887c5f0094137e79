"""The live pages in headless Chromium (Debian's chromium and chromium-driver, driven by
selenium; nothing downloaded): a node's /ui against a live 3-node cluster under load, its
numbers checked against /health fetched before and after, and governord's /ui against
/ui/status. The screenshots go to docs/ (README.md and docs/governord.md show them) with
RATEMESH_SCREENSHOTS=1."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.mesh._util import require_binary
from tests.ops._fleet import DOWN, DRIFTER, GHOST, HOT, STRICT_BURST, STRICT_RATE, running_fleet
from tests.ops._kit import ROOT

pytestmark = pytest.mark.slow

# Everything the page drew, read in one script (the page's JS cannot run in between).
_READ = """
const cells = {};
for (const tr of document.querySelectorAll('tr[data-key]')) {
  const table = tr.closest('table').id;
  const row = cells[table + ' ' + tr.dataset.key] = {};
  for (const td of tr.querySelectorAll('td[data-field]')) row[td.dataset.field] = td.textContent;
}
return {refreshes: window.refreshes, doc: window.lastDoc, cells: cells};
"""


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = require_binary("chromium", "chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1400,1000")
    service = Service(executable_path=require_binary("chromedriver", "chromium-driver"))
    driver = webdriver.Chrome(options=opts, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def _shots(tmp_path: Path) -> Path:
    """docs/ with RATEMESH_SCREENSHOTS=1 (to refresh the docs' images), else the test's
    own directory, so a test run leaves the tree clean."""
    return ROOT / "docs" if os.environ.get("RATEMESH_SCREENSHOTS") == "1" else tmp_path


def _wait(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _refreshes(browser: Any) -> int:
    return int(browser.execute_script("return window.refreshes || 0"))


def _read_after(browser: Any, fetch: Callable[[], Any]) -> tuple[Any, dict[str, Any], Any]:
    """(fetched before, what the page drew, fetched after), the page having refreshed twice
    after the first fetch: its document was read between the two."""
    before = fetch()
    n = _refreshes(browser)
    _wait(lambda: _refreshes(browser) >= n + 2, "two refreshes")
    page = browser.execute_script(_READ)
    return before, page, fetch()


def _key(x: dict[str, Any]) -> str:
    desc = f"[{x['descriptor']}]" if x.get("descriptor") else ""
    return f"{x['tenant']}{desc}|{x['metric']}"


def test_the_node_page_shows_the_numbers_of_health_under_load(tmp_path: Path, browser: Any) -> None:
    with running_fleet(tmp_path) as fleet:
        _wait(lambda: fleet.asked > 3000, "load")
        browser.get(f"http://{fleet.telemetry['a']}/ui")
        _wait(lambda: _refreshes(browser) >= 2, "the page's first refreshes")
        h0, page, h1 = _read_after(browser, lambda: fleet.health("a"))
        assert not fleet.errors, fleet.errors
        doc, cells = page["doc"], page["cells"]
        assert doc["member_id"] == "a" and doc["membership"]["N"] == 4
        before = {_key(x): x for x in h0["limits"]}
        after = {_key(x): x for x in h1["limits"]}
        assert set(before) == set(after) == {_key(x) for x in doc["limits"]}
        for x in doc["limits"]:
            k, row = _key(x), cells[f"limits {_key(x)}"]
            for f in ("target_rate", "global_burst", "bound", "mode", "generation"):
                assert str(x[f]) == row[f], (k, f)
                # the bound may say a stale view between the fetches (a loaded machine)
                assert f == "bound" or x[f] == after[k][f], (k, f)
            if x["tenant"] == "*":  # its tenants count under their own names ("served")
                assert row["admitted"] == row["denied"] == "-", row
                continue
            # counters: what the page drew lies between the fetches around it
            for f in ("admitted", "denied"):
                assert before[k][f] <= x[f] <= after[k][f], (k, f, before[k][f], x[f])
                assert _num(row[f]) == x[f], (k, f)
            assert _num(row["excess_estimate"]) == pytest.approx(x["excess_estimate"], abs=1e-3)
            assert _num(row["excess_bound"]) == pytest.approx(x["excess_bound"], abs=1e-3)
            assert 0 <= x["excess_estimate"] <= x["excess_bound"], k
            assert row["admitted_rate"] != "-", k  # a rate between two refreshes
            assert row["suspended"] == (x["suspended"] or "-")
        assert doc["limits"] and all(x["admitted"] > 0 for x in doc["limits"] if x["tenant"] != "*")
        assert after[f"{HOT['tenant_id']}|read_iops"]["denied"] > 0  # past hot's limit
        suspended = {k for k in cells if k.startswith("suspended ")}
        assert suspended == {f"suspended {_key(s)}|{s['reason']}" for s in doc["suspended"]}
        # the limit the down member owns: suspended, with its reason, on the page
        ghost = f"{GHOST['tenant_id']}|read_iops"
        assert f"suspended {ghost}|owner_unreachable" in suspended
        assert cells[f"limits {ghost}"]["suspended"] == "owner_unreachable"
        # whom it waits on: the down member owns it, and it is not reachable
        assert cells[f"suspended {ghost}|owner_unreachable"]["owner"] == DOWN
        assert cells[f"suspended {ghost}|owner_unreachable"]["owner_reachable"].startswith(
            "unreachable"
        )
        members = {k.split(" ", 1)[1] for k in cells if k.startswith("members ")}
        assert members == set(h1["membership"]["members"]) == {"a", "b", "c", "d"}
        assert cells["members a"]["self"] == "yes"
        assert cells["members a"]["reachable"] == "this member"
        assert cells[f"members {DOWN}"]["reachable"].startswith("unreachable")
        # a tenant served under the default policy has a row of its own, as /health has it
        served = {f"{x['tenant']}|{x['metric']}": x for x in doc["served"]}
        row = cells[f"served {DRIFTER}|read_iops"]
        assert row["policy"] == "*" and row["mode"] == "global"
        assert _num(row["admitted"]) == served[f"{DRIFTER}|read_iops"]["admitted"] > 0
        for e in h1["policies"]["enforced"]:
            assert cells[f"enforced {_key(e)}"]["generation"] == str(e["generation"])
        browser.save_screenshot(str(_shots(tmp_path) / "ui-node.png"))

        # governord's page: the tree against /ui/status
        def status() -> Any:
            return httpx.get(f"http://{fleet.governord_http}/ui/status", timeout=10).json()

        browser.get(f"http://{fleet.governord_http}/ui")
        _wait(lambda: _refreshes(browser) >= 1, "governord's page")
        s0, gpage, s1 = _read_after(browser, status)
        gdoc, gcells = gpage["doc"], gpage["cells"]
        # role, leader and store, as governord's /health says them
        gh = browser.execute_script("return window.lastHealth")
        assert gh["role"] == "leader" and gcells["health role"]["state"] == "leader"
        assert gcells["health store"]["state"].startswith("ok (sqlite")
        assert gcells["health ready"]["state"] == "yes"
        # the mesh policies it serves: none pushed in this fleet (its nodes' are inline)
        assert gdoc["policies"]["count"] == s1["policies"]["count"] == 0
        assert not [k for k in gcells if k.startswith("policies ")]
        assert [n["path"] for n in gdoc["tree"]] == [n["path"] for n in s1["tree"]]
        a = next(n for n in gdoc["tree"] if n["path"].endswith("/a"))
        row = gcells[f"tree {a['path']}|read_iops"]
        assert _num(row["credit_outstanding"]) == a["credit"]["read_iops"]["outstanding"]
        assert _num(row["credit_level"]) == a["credit"]["read_iops"]["level"]
        assert row["per_s"] == str(STRICT_RATE) and row["burst"] == str(STRICT_BURST)
        used0 = next(n for n in s0["tree"] if n["path"] == a["path"])["used"].get("read_iops", 0)
        used1 = next(n for n in s1["tree"] if n["path"] == a["path"])["used"].get("read_iops", 0)
        assert used0 <= a["used"].get("read_iops", 0) <= used1
        assert _num(row["used"]) == a["used"].get("read_iops", 0)
        browser.save_screenshot(str(_shots(tmp_path) / "ui-governord.png"))

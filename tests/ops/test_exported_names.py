"""Every metric the dashboard and the alert rules name is one a live fleet exports: three
`mesh node` processes and governord under load, each /metrics scraped and passed through
`promtool check metrics`."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.mesh._util import require_binary
from tests.ops._fleet import IDS, running_fleet
from tests.ops._kit import expressions, rule_test_series
from tests.ops._promql import SYNTHETIC, exported_names, metric_names

pytestmark = pytest.mark.slow


def test_every_metric_the_dashboard_and_rules_name_is_exported(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "prometheus")
    scraped: dict[str, str] = {}
    with running_fleet(tmp_path) as fleet:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # reports acknowledged: d's histogram has samples
            h = fleet.health("a")
            if h["strict"]["granted"] and fleet.asked > 3000:
                break
            time.sleep(0.2)
        assert not fleet.errors, fleet.errors
        for m in IDS:
            scraped[m] = fleet.get(fleet.telemetry[m], "/metrics").text
        scraped["governord"] = fleet.get(fleet.governord_http, "/metrics").text
    for who, text in scraped.items():
        out = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, f"{who}: {out.stdout}{out.stderr}"
    exported = set().union(*(exported_names(t) for t in scraped.values())) | SYNTHETIC
    assert "ratemesh_report_delay_seconds_bucket" in exported
    missing = {
        where: sorted(metric_names(expr) - exported)
        for where, expr in expressions().items()
        if metric_names(expr) - exported
    }
    assert missing == {}
    # the rules' unit tests feed the names the daemons export, not names of their own
    assert rule_test_series() - exported == set()
    # what each names is a sample of a live scrape, not only a declared family
    sampled = " ".join(scraped.values())
    for name in (
        "ratemesh_excess_estimate",
        "ratemesh_excess_bound",
        "ratemesh_admitted_units_total",
        "ratemesh_limit_rate",
        "ratemesh_limit_burst",
        "ratemesh_owner_applied_total",
        "governor_credit_outstanding",
    ):
        assert f"\n{name}{{" in sampled, name

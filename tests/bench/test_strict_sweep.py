"""`mesh bench strict --sweep` on two short rows, one behind the delaying proxy: the keys
DESIGN.md section 5 lists, the envelope in every row, and that the delay was really there
(bounds, not speeds)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test runs the mesh command and a fleet

DELAY_MS = 20


def _mesh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh.cli", "bench", "strict", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_tiny_sweep_keeps_the_envelope_and_its_proxy_delays() -> None:
    out = _mesh(
        "--sweep", "--b-over-r", "0.5", "--workers", "2", "--threads", "2",
        "--delay-ms", f"0,{DELAY_MS}", "--seconds", "1.5",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert res["credit"] == "defaults" and res["offered_x"] == 3.0
    rows = res["rows"]
    assert [(r["b_over_r_s"], r["workers"], r["delay_ms"]) for r in rows] == [
        (0.5, 2, 0),
        (0.5, 2, DELAY_MS),
    ]
    for r in rows:
        for key in ("b_over_r_s", "workers", "delay_ms", "utilisation", "max_excess"):
            assert key in r, key
        assert r["burst"] == r["rate"] // 2
        assert isinstance(r["admitted"], int) and 0 < r["admitted"] <= r["offered"], r
        assert sum(r["per_worker_admitted"]) == r["admitted"]
        assert r["max_excess"] <= 0, r
        assert r["utilisation"] == round(r["admitted"] / (r["rate"] * 1.5 + r["burst"]), 4)
    direct, delayed = rows
    # each node reached governord through the proxy (its connections, and the probe's one),
    # and a round trip through it crossed its delay each way
    assert (direct["proxy_connections"], direct["proxy_bytes"]) == (0, 0), direct
    assert delayed["proxy_connections"] >= 2 + 1 and delayed["proxy_bytes"] > 0, delayed
    assert delayed["governord_rtt_ms"] >= 2 * DELAY_MS, delayed
    assert out.stderr.count("mesh bench strict --sweep: row ") == 2  # progress, per row


def test_sweep_flags_refuse_a_mistake_in_one_line() -> None:
    for args, flag in (
        (("--sweep", "--delay-ms", "5,x"), "--delay-ms"),
        (("--sweep", "--b-over-r", "0"), "--b-over-r"),
        (("--sweep", "--credit", "{lead_ms: 0}"), "--credit.lead_ms"),
        (("--delay-ms", "5"), "--delay-ms"),
    ):
        out = _mesh(*args)
        assert out.returncode == 2 and out.stdout == "", (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and flag in out.stderr, out.stderr

"""`mesh bench redis --json`, briefly: the keys DESIGN.md section 5 names, exactness while
Redis answers, and every fallback disclosed (speed is the machine's, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.mesh._util import require_binary

pytestmark = pytest.mark.slow

KEYS = {
    "workers",
    "admitted",
    "allowed_max",
    "exact",
    "up_p99_us",
    "frozen_p99_ms",
    "down_p99_us",
    "fallback_disclosed",
}


def test_bench_redis_keys_exact_and_disclosed() -> None:
    require_binary("redis-server", "redis-server")
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "bench", "redis", "--workers", "2"]
        + ["--seconds", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert KEYS <= set(res)
    assert res["workers"] == 2
    assert res["exact"] is True and res["admitted"] <= res["allowed_max"]
    assert res["admitted"] > 0
    assert res["fallback_disclosed"] is True
    assert res["frozen_decisions"] > 0 and res["down_decisions"] > 0
    assert res["recovered"] is True  # the breaker closed on the restarted server


def test_bench_redis_refuses_a_bad_flag_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "bench", "redis", "--workers", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "--workers" in out.stderr

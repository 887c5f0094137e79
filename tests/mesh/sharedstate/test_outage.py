"""Losing the shared counter degrades the guarantee, not the traffic (seed 002), on a
redis-server this test starts itself:

* frozen (SIGSTOP): each decision returns within the deadline plus slack, answered by the
  embedded limiter and suspended redis_unreachable; five in a row open the breaker, and
  then no call waits at all;
* gone (SIGKILL): the open breaker answers locally with no round trip;
* restarted on the same port: after the probe interval one call probes, the good answer
  closes the breaker (positive recovery), and the script is loaded again (NOSCRIPT);
* gone while closed: refused connections open the breaker the same way.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from mesh.core.admission._breaker import BREAKER_FAILURES, BREAKER_PROBE_NS
from mesh.core.verdict import Step, Suspension, Verdict
from mesh.node import Mesh
from mesh.sharedstate import RedisCounter
from tests.mesh.sharedstate._redis import RedisServer, redis_config, unique

pytestmark = pytest.mark.slow

DEADLINE_S = 0.005
SLACK_S = 0.25  # a loaded machine's scheduling, not the deadline's
PROBE_S = BREAKER_PROBE_NS / 1e9


def _timed(mesh: Mesh, tenant: str) -> tuple[Verdict, float]:
    t0 = time.monotonic()
    v = mesh.try_admit(tenant, "read_iops")
    return v, time.monotonic() - t0


def _redis(mesh: Mesh) -> dict[str, Any]:
    out: dict[str, Any] = mesh.health()["redis"]
    return out


def test_frozen_gone_and_back(own_redis: RedisServer) -> None:
    tenant = unique("outage")
    policy = {
        "tenant_id": tenant,
        "metric": "read_iops",
        "generation": 1,
        "target_rate": 1000,
        "global_burst": 100,
        "local_burst_cap": 1,
        "mode": "redis",
    }
    mesh = Mesh(redis_config(own_redis.addr, [policy])).start()
    try:
        v, _ = _timed(mesh, tenant)
        assert v.allowed and v.step is Step.REDIS and v.suspended is None

        own_redis.freeze()
        frozen = [_timed(mesh, tenant) for _ in range(BREAKER_FAILURES + 20)]
        for v, took in frozen:
            assert v.suspended is Suspension.REDIS_UNREACHABLE and v.step is Step.LOCAL
            assert took < DEADLINE_S + SLACK_S
        h = _redis(mesh)
        assert h["breaker"] == "open" and h["breaker_opened"] == 1
        assert h["fallbacks"]["deadline_exceeded"] == BREAKER_FAILURES
        assert h["fallbacks"]["breaker_open"] == 20
        asked = h["asked"]

        own_redis.kill()  # SIGKILL of the stopped process: gone
        gone = [_timed(mesh, tenant) for _ in range(50)]
        assert all(v.suspended is Suspension.REDIS_UNREACHABLE for v, _ in gone)
        assert _redis(mesh)["asked"] == asked  # the open breaker made no round trip

        own_redis.start()  # the same port, an empty server: no script, no buckets
        deadline = time.monotonic() + PROBE_S + 10
        while time.monotonic() < deadline:
            v, _ = _timed(mesh, tenant)
            if v.step is Step.REDIS:
                break
            assert v.suspended is Suspension.REDIS_UNREACHABLE
            time.sleep(0.05)
        assert v.step is Step.REDIS and v.suspended is None, "the breaker never closed"
        h = _redis(mesh)
        assert h["breaker"] == "closed" and h["breaker_closed"] == 1
        counter = mesh._counter
        assert isinstance(counter, RedisCounter) and counter.loads >= 2  # NOSCRIPT: reloaded

        own_redis.kill()  # gone while closed: refused at once, five times, then open
        for _ in range(BREAKER_FAILURES + 5):
            v, took = _timed(mesh, tenant)
            assert v.suspended is Suspension.REDIS_UNREACHABLE
            assert took < DEADLINE_S + SLACK_S
        h = _redis(mesh)
        assert h["breaker"] == "open" and h["fallbacks"]["connect_failed"] == BREAKER_FAILURES
        assert h["last_error"]
    finally:
        mesh.stop()

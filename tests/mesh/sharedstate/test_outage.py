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


def _until_redis(mesh: Mesh, tenant: str, timeout_s: float = 5.0) -> Verdict:
    """The first verdict Redis gives: the first call opens the socket and loads the script
    (four round trips), which a loaded machine may not fit in one deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = mesh.try_admit(tenant, "read_iops")
        if v.step is Step.REDIS or time.monotonic() > deadline:
            return v
        assert v.suspended is Suspension.REDIS_UNREACHABLE
        time.sleep(0.01)


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
        v = _until_redis(mesh, tenant)
        assert v.allowed and v.step is Step.REDIS and v.suspended is None
        before = _redis(mesh)["fallbacks"]["deadline_exceeded"]  # a slow first connect

        own_redis.freeze()
        frozen = [_timed(mesh, tenant) for _ in range(BREAKER_FAILURES + 20)]
        for v, took in frozen:
            assert v.suspended is Suspension.REDIS_UNREACHABLE and v.step is Step.LOCAL
            assert took < DEADLINE_S + SLACK_S
        h = _redis(mesh)
        assert h["breaker"] == "open" and h["breaker_opened"] == 1
        assert h["fallbacks"]["deadline_exceeded"] - before == BREAKER_FAILURES
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


def test_a_thawed_server_gives_no_stale_answers(own_redis: RedisServer) -> None:
    """Calls that missed the deadline leave replies in flight; the client drops those
    connections, so after SIGCONT no answer belongs to another call. The frozen calls are
    on a tenant whose bucket is 1,000 deep: a stale reply landing on the fresh tenant's
    (10 deep) would show a remaining above its burst (refused as reply_malformed)."""
    frozen_tenant, tenant = unique("stale"), unique("fresh")
    policies = [
        {
            "tenant_id": t,
            "metric": "read_iops",
            "generation": 1,
            "target_rate": 1,
            "global_burst": burst,
            "local_burst_cap": 1,
            "mode": "redis",
        }
        for t, burst in ((frozen_tenant, 1000), (tenant, 10))
    ]
    mesh = Mesh(redis_config(own_redis.addr, policies)).start()
    try:
        assert _until_redis(mesh, frozen_tenant).step is Step.REDIS
        own_redis.freeze()
        for _ in range(BREAKER_FAILURES - 2):  # the breaker stays closed
            assert mesh.try_admit(frozen_tenant, "read_iops").step is Step.LOCAL
        own_redis.thaw()
        time.sleep(0.2)  # the frozen calls' replies arrive on connections already dropped
        answers = [mesh.try_admit_detailed(tenant, "read_iops") for _ in range(12)]
        exact = [v for v in answers if v.step is Step.REDIS]
        assert exact, "Redis never answered after the thaw"
        assert sum(v.allowed for v in exact) <= 10
        assert all(v.remaining is not None for v in exact)
        remaining = [v.remaining or 0 for v in exact]
        assert all(r <= 9 for r in remaining)
        assert remaining == sorted(remaining, reverse=True)  # the bucket only drains
        assert _redis(mesh)["fallbacks"]["reply_malformed"] == 0
    finally:
        mesh.stop()

"""/health's capability block (seed 002): a lone node says it is one, in words; a
node with a Redis tier, a quota and redis, global and local limits lists the tier, each
mode with its bound and what converges, and the suspensions in force."""

from __future__ import annotations

from typing import Any

import redis

from mesh.core.policy import BOUNDS
from mesh.node import Mesh
from tests.mesh.sharedstate._redis import SHARED, redis_config, unique


def _policy(tenant: str, mode: str, **extra: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "tenant_id": tenant,
        "metric": "read_iops",
        "generation": 1,
        "target_rate": 100,
        "global_burst": 10,
        "local_burst_cap": 2,
        "mode": mode,
    }
    p.update(extra)
    return p


def test_a_lone_node_says_it_is_one() -> None:
    cfg = {
        "listen": "127.0.0.1:0",
        "member_id": unique("m"),
        "shutdown_drain_ms": 100,
        "policies": {"inline": [_policy("t", "global"), _policy("r", "redis")]},
    }
    mesh = Mesh(cfg).start()
    try:
        mesh.try_admit("r", "read_iops")
        cap = mesh.health()["capability"]
        assert cap["shared_state_enabled"] is False
        assert [t["tier"] for t in cap["tiers"]] == ["mesh"]
        assert "single node" in cap["note"]
        assert "redis limits without shared_state.redis" in cap["warning"]
        assert cap["modes"]["global"]["bound"] == BOUNDS["global"]
        assert cap["suspensions"] == {"redis_unreachable": 1}
    finally:
        mesh.stop()


def test_tiers_modes_and_convergence(shared_redis: redis.Redis) -> None:
    q, r, loc = unique("q"), unique("r"), unique("l")
    quota = {
        "tenant_id": q,
        "metric": "spend",
        "unit": "usd_micros",
        "generation": 1,
        "quota": 1_000_000,
        "period": "day",
    }
    cfg = redis_config(SHARED, [quota, _policy(r, "redis"), _policy(loc, "local")])
    mesh = Mesh(cfg).start()
    try:
        assert mesh.try_admit(q, "spend", 10).allowed
        mesh.try_admit(r, "read_iops")
        cap = mesh.health()["capability"]
        assert cap["shared_state_enabled"] is True
        redis_tier = next(t for t in cap["tiers"] if t["tier"] == "redis")
        assert redis_tier["addr"] == SHARED and "spend quota cells" in redis_tier["serves"]
        assert set(cap["modes"]) == {"quota", "redis", "local"}
        assert cap["modes"]["redis"]["bound"] == BOUNDS["redis"]
        assert "peers burned" in cap["modes"]["quota"]["error"]
        assert cap["convergence"]["quotas"] == 1 and cap["convergence"]["redis_tier"] is True
        assert "note" not in cap
    finally:
        mesh.stop()

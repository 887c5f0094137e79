"""Every API of a node for a redis limit, against the real Redis on 127.0.0.1:6379: the
sidecar's batches (mixed with other modes and a refused row), the waiting forms, /health's
redis block and the /metrics families."""

from __future__ import annotations

import asyncio
from typing import Any

import redis

from mesh.core.verdict import Reason, Step
from mesh.errors import ConfigError
from mesh.node import Mesh
from tests.mesh._util import http_get
from tests.mesh.sharedstate._redis import SHARED, redis_config, unique


def _policy(tenant: str, mode: str = "redis", rate: int = 20, burst: int = 2) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "metric": "read_iops",
        "generation": 1,
        "target_rate": rate,
        "global_burst": burst,
        "local_burst_cap": 1,
        "mode": mode,
    }


def test_a_batch_mixes_redis_rows_with_the_rest_in_order(shared_redis: redis.Redis) -> None:
    r, loc = unique("batch"), unique("local")
    cfg = redis_config(SHARED, [_policy(r), _policy(loc, "local", burst=5)])
    mesh = Mesh(cfg).start()
    try:
        rows = [(r, "read_iops", 1), (loc, "read_iops", 1), (r, "Bad Name", 1)]
        rows += [(r, "read_iops", 1), (r, "read_iops", 1)]
        out = mesh.try_admit_numbers_many(rows)
        assert isinstance(out[2], ConfigError)
        answers = [a for a in out if not isinstance(a, ConfigError)]
        redis_rows = [answers[i] for i in (0, 2, 3)]
        if all(v.step is Step.REDIS for v, _ in redis_rows):  # a loaded machine may miss one
            assert [v.allowed for v, _ in redis_rows] == [True, True, False]
            assert [n.remaining for _, n in redis_rows if n is not None] == [1, 0, 0]
        v, n = answers[1]
        assert v.step is Step.LOCAL and v.allowed and n is not None
    finally:
        mesh.stop()


def test_the_waiting_forms_ask_again_after_retry_after(shared_redis: redis.Redis) -> None:
    tenant = unique("wait")
    mesh = Mesh(redis_config(SHARED, [_policy(tenant, rate=20, burst=1)])).start()
    try:
        first = mesh.admit_blocking(tenant, "read_iops", timeout_s=1.0)
        assert first.allowed
        again = mesh.admit_blocking(tenant, "read_iops", timeout_s=1.0)  # 50 ms later
        assert again.allowed and again.retry_after_ms == 0
        late = mesh.admit_blocking(tenant, "read_iops", timeout_s=0.001)
        if late.step is not Step.LOCAL:  # Redis answered (not a missed deadline)
            assert late.reason is Reason.DEADLINE_EXCEEDED and late.step is Step.QUEUE
            assert late.retry_after_ms is not None and late.retry_after_ms > 0

        async def waits() -> tuple[bool, bool]:
            ok = await mesh.admit(tenant, "read_iops", timeout_s=1.0)
            now = await mesh.admit(tenant, "read_iops", timeout_s=0)
            return ok.allowed, now.allowed

        assert asyncio.run(waits())[0]
    finally:
        mesh.stop()


def test_health_and_metrics_show_the_tier(shared_redis: redis.Redis) -> None:
    tenant = unique("seen")
    cfg = redis_config(SHARED, [_policy(tenant)], telemetry_listen="127.0.0.1:0")
    mesh = Mesh(cfg).start()
    try:
        for _ in range(3):
            mesh.try_admit(tenant, "read_iops")
        h = mesh.health()["redis"]
        assert h["configured"] is True and h["addr"] == SHARED
        assert h["breaker"] == "closed" and h["asked"] == 3
        assert h["answered"] + sum(h["fallbacks"].values()) == 3
        text = http_get(mesh.telemetry_address, "/metrics").text
        assert "ratemesh_redis_answered_total" in text
        assert 'ratemesh_redis_fallbacks_total{cause="breaker_open"}' in text
        assert "ratemesh_redis_breaker_open 0.0" in text
        assert tenant not in text.split("ratemesh_redis")[1]  # no tenant on the tier's series
    finally:
        mesh.stop()


def test_a_node_without_a_tier_says_so() -> None:
    mesh = Mesh(
        {"listen": "127.0.0.1:0", "member_id": unique("m"), "policies": {"inline": []}}
    ).start()
    try:
        assert mesh.health()["redis"] == {"configured": False, "addr": None}
    finally:
        mesh.stop()

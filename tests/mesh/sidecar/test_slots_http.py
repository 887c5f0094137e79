"""In-flight slots over the sidecar's HTTP routes (a real uvicorn server on loopback):
acquire hands out a token, release takes it, a crashed client's slots run out with their
TTL, a client holds a bounded number of tokens, and bad bodies are one-line 400s."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from mesh.sidecar._slots import SlotTokens
from tests.mesh.sidecar._node import node, node_config

SLOTS: dict[str, Any] = {
    "tenant_id": "acme",
    "metric": "origin_loads",
    "generation": 1,
    "mode": "local",
    "concurrency": 2,
}
ACQ = {"tenant": "acme", "metric": "origin_loads"}


def test_acquire_release_ttl_and_bounds() -> None:
    async def main() -> None:
        cfg = node_config()
        cfg["policies"]["inline"].append(SLOTS)
        async with node(cfg) as mesh, httpx.AsyncClient(timeout=5) as c:
            base = f"http://{mesh.sidecar_addresses['http']}/v1"
            one = (await c.post(f"{base}/acquire", json=ACQ)).json()
            two = (await c.post(f"{base}/acquire", json={**ACQ, "ttl_ms": 100})).json()
            assert one["allowed"] and two["allowed"] and one["token"] != two["token"], (one, two)
            assert one["in_flight"] == 1 and one["cap"] == 2 and one["bound"] == "in_flight<=N*C"
            full = await c.post(f"{base}/acquire", json=ACQ)
            assert full.status_code == 200 and not full.json()["allowed"], full.json()
            assert "token" not in full.json() and full.json()["reason"] == "concurrency_limited"
            r = await c.post(f"{base}/release", json={"token": one["token"]})
            assert r.json() == {"ok": True}
            r = await c.post(f"{base}/release", json={"token": one["token"]})
            assert r.json() == {"ok": False}  # released already
            await asyncio.sleep(0.2)  # `two` was taken with a 100 ms TTL: a crashed client
            three = (await c.post(f"{base}/acquire", json=ACQ)).json()
            four = (await c.post(f"{base}/acquire", json=ACQ)).json()
            assert three["allowed"] and four["allowed"], (three, four)
            for body, field in (
                ({"tenant": "acme"}, "metric"),
                ({**ACQ, "ttl_ms": 0}, "ttl_ms"),
                ({**ACQ, "amount": 2}, "amount"),
                ({**ACQ, "metric": "read_iops"}, "metric"),
            ):
                bad = await c.post(f"{base}/acquire", json=body)
                assert bad.status_code == 400 and bad.json()["error"].startswith(field), bad.json()
            bad = await c.post(f"{base}/release", json={"tok": 1})
            assert bad.status_code == 400 and bad.json()["error"].startswith("token")
            # a 429 instead of 200 for a denial, when the caller asks for it
            r = await c.post(f"{base}/acquire", json=ACQ, headers={"x-ratemesh-deny-status": "429"})
            assert r.status_code == 429 and not r.json()["allowed"], r.json()

    asyncio.run(main())


class _Keeper:
    def __init__(self) -> None:
        self.n = 0

    def acquire_slot(self, tenant: str, metric: str, *, ttl_ms: int | None = None) -> Any:
        from mesh.core.concurrency import SlotDesk
        from ratemesh.policy import Mode, TenantRatePolicy

        self.n += 1
        return SlotDesk("a", 1).acquire(
            TenantRatePolicy(tenant, metric, 1, concurrency=100, mode=Mode.LOCAL), 0, 1, ttl_ms
        )

    def release_slot(self, lease: int) -> bool:
        return True


def test_a_client_holds_a_bounded_number_of_tokens_and_only_its_own() -> None:
    import pytest

    from mesh.errors import ConfigError

    now = [0]
    tokens = SlotTokens(_Keeper(), per_client_max=3, tokens_max=5, clock_ms=lambda: now[0])
    got = [tokens.acquire("x", {**ACQ, "ttl_ms": 50})["token"] for _ in range(3)]
    with pytest.raises(ConfigError, match="holds 3 slot tokens"):
        tokens.acquire("x", ACQ)
    assert not tokens.release("y", {"token": got[0]})  # not y's
    assert tokens.release("x", {"token": got[0]})
    tokens.acquire("y", ACQ)
    tokens.acquire("y", ACQ)
    tokens.acquire("x", ACQ)
    with pytest.raises(ConfigError, match="the sidecar holds 5"):
        tokens.acquire("z", ACQ)
    now[0] = 100  # x's TTL'd tokens ran out: pruned when a bound is reached
    assert tokens.acquire("z", ACQ)["allowed"] and len(tokens.tokens) == 4


def test_acquire_and_release_over_grpc() -> None:
    import grpc
    from grpc import aio

    from mesh.sidecar import concurrency_pb2 as cpb

    async def main() -> None:
        cfg = node_config()
        cfg["policies"]["inline"].append(SLOTS)
        async with node(cfg) as mesh, aio.insecure_channel(mesh.sidecar_addresses["grpc"]) as ch:
            acquire = ch.unary_unary(
                "/ratemesh.sidecar.v1.Concurrency/Acquire",
                request_serializer=cpb.AcquireRequest.SerializeToString,
                response_deserializer=cpb.AcquireResponse.FromString,
            )
            release = ch.unary_unary(
                "/ratemesh.sidecar.v1.Concurrency/Release",
                request_serializer=cpb.ReleaseRequest.SerializeToString,
                response_deserializer=cpb.ReleaseResponse.FromString,
            )
            one = await acquire(cpb.AcquireRequest(tenant="acme", metric="origin_loads"))
            two = await acquire(
                cpb.AcquireRequest(tenant="acme", metric="origin_loads", ttl_ms=60_000)
            )
            assert one.allowed and two.allowed and one.token and one.cap == 2, (one, two)
            three = await acquire(cpb.AcquireRequest(tenant="acme", metric="origin_loads"))
            assert not three.allowed and three.reason == "concurrency_limited" and not three.token
            assert (await release(cpb.ReleaseRequest(token=one.token))).ok
            assert not (await release(cpb.ReleaseRequest(token=one.token))).ok
            try:
                await acquire(cpb.AcquireRequest(tenant="acme", metric="read_iops"))
                raise AssertionError("a rate metric was given a slot")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
                assert "no concurrency limit" in (exc.details() or "")

    asyncio.run(main())

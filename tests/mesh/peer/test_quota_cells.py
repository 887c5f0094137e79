"""Spend-quota cells over a real peer stream: a member writes only its own cell (the
stream's member, never a claimed one), and the owner answers with its fold."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc import aio

from bench._procs import free_port
from mesh.core.messages import Cell, CellFold, CellPublish, decode, encode
from mesh.core.policy import RateKey
from mesh.core.quota import period_index
from mesh.node import Mesh
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from mesh.peer._wire import SCHEMA
from ratemesh.policy import Period

pytestmark = pytest.mark.slow  # a node on a real socket


def _quota(tenant: str) -> dict[str, Any]:
    return {"tenant_id": tenant, "metric": "spend", "generation": 1, "period": "day", "quota": 100}


async def _exchange(addr: str, member: str, msg: CellPublish) -> tuple[grpc.StatusCode, Any]:
    md = ((MEMBER_MD, member), (SCHEMA_MD, SCHEMA), (EPOCH_MD, "7"))
    async with aio.insecure_channel(addr) as channel:
        call = channel.stream_stream(EXCHANGE)(metadata=md, timeout=10)
        try:
            await call.initial_metadata()
            await call.write(encode(msg))
            try:
                reply = await call.read()
            except aio.AioRpcError as exc:  # refused: the stream ends with a status
                return exc.code(), exc.details()
            if reply is aio.EOF:
                return await call.code(), await call.details()
            return grpc.StatusCode.OK, decode(reply)
        finally:
            call.cancel()


def test_a_member_writes_only_its_own_cell_and_gets_the_fold() -> None:
    async def main() -> None:
        addr = f"127.0.0.1:{free_port()}"
        ring = {"n": addr, "b": f"127.0.0.1:{free_port()}"}
        tenants = [f"q{i}" for i in range(32)]
        cfg = {
            "member_id": "n",
            "listen": addr,
            "membership": {"source": "static", "members": ring},
            "policies": {"inline": [_quota(t) for t in tenants]},
        }
        async with Mesh(cfg) as node:
            key = next(
                k for k in (RateKey(t, "spend", 1) for t in tenants) if node.ring.owner_of(k) == "n"
            )
            day = period_index(Period.DAY, _now_ms())
            forged = CellPublish("mallory", 1, (Cell(key, day, 50),))
            code, details = await _exchange(node.address, "b", forged)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "sender" in details, details
            assert node.health()["quotas"]["folds"] == 0  # nothing changed
            own = CellPublish("b", 1, (Cell(key, day, 40),))
            code, reply = await _exchange(node.address, "b", own)
            assert code == grpc.StatusCode.OK and isinstance(reply, CellFold), reply
            assert [(r.combined, r.own) for r in reply.rows] == [(40, 40)]
            again = CellPublish("b", 1, (Cell(key, day, 40),))  # a retry: no second copy
            code, reply = await _exchange(node.address, "b", again)
            assert [(r.combined, r.own) for r in reply.rows] == [(40, 40)]
            above = CellPublish("b", 1, (Cell(key, day, 101),))  # above the quota: refused
            code, reply = await _exchange(node.address, "b", above)
            assert reply.rows == () and node.health()["quotas"]["refused"] == {
                "burn_above_quota": 1
            }

    asyncio.run(main())


def _now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000

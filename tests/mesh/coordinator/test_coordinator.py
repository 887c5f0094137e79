"""Policies from a coordinator over gRPC (in-process): watch, new generations, the polling
fallback while it is down, and fail-closed for what is not known yet."""

from __future__ import annotations

import asyncio

import pytest

from bench._procs import free_port
from mesh.coordinator import PolicyStore
from mesh.core.verdict import Reason
from mesh.errors import PeerRefused, PeerUnavailable
from mesh.node import Mesh
from mesh.peer import CoordinatorClient
from mesh.testing.coordinator import CoordinatorServer
from tests.mesh._util import POLICY, until


def test_policies_arrive_by_watch_and_survive_a_coordinator_outage() -> None:
    async def main() -> None:
        store = PolicyStore()
        listen = f"127.0.0.1:{free_port()}"
        server = CoordinatorServer(store, listen)
        addr = await server.start()
        client = CoordinatorClient(addr)
        cfg = {"member_id": "a", "policies": {"coordinator": {"addr": addr, "poll_ttl_ms": 100}}}
        async with Mesh(cfg) as mesh:
            v = mesh.try_admit("acme", "read_iops")
            assert v.reason is Reason.POLICY_UNKNOWN  # never a permissive default

            p1 = await client.put(POLICY)
            assert p1.generation == 1
            await until(
                lambda: mesh.try_admit("acme", "read_iops").allowed,
                3,
                "generation 1 arrived by watch",
            )

            p2 = await client.put(dict(POLICY, target_rate=500))
            assert p2.generation == 2
            await until(lambda: _generation(mesh) == 2, 3, "generation 2 arrived")

            with pytest.raises(PeerRefused) as err:
                await client.put(dict(POLICY, target_rate=-1))
            assert "target_rate" in str(err.value)

            await server.stop()  # the coordinator goes away
            await until(
                lambda: not mesh.health()["policies"]["coordinator"]["watching"],
                3,
                "the watch noticed",
            )
            assert mesh.try_admit("acme", "read_iops").reason is not Reason.POLICY_UNKNOWN
            store.put(dict(POLICY, target_rate=250))  # generation 3, while unreachable
            await asyncio.sleep(0.3)
            assert _generation(mesh) == 2
            server = CoordinatorServer(store, addr)
            await server.start()
            await until(lambda: _generation(mesh) == 3, 5, "recovered by poll or watch")
        await client.close()
        await server.stop()
        dead = CoordinatorClient(f"127.0.0.1:{free_port()}", timeout_s=0.3)
        with pytest.raises(PeerUnavailable):
            await dead.list()
        await dead.close()

    asyncio.run(main())


def _generation(mesh: Mesh) -> int:
    limits = mesh.health()["limits"]
    return max((x["generation"] for x in limits), default=0)

"""A client given a standby's address alone follows the leader the standby names (the
`not_leader` hint), learning that address: `mesh policy list --coordinator <standby>`
answers from the leader rather than failing with its name. Learned addresses are bounded."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import grpc
import pytest

from governor.client.leader import ADDRS_LEARNED_MAX, CallFailed, LeaderFollower
from mesh.coordinator import PolicyStore
from mesh.peer import CoordinatorClient
from mesh.testing.coordinator import CoordinatorServer
from tests.governor._standby import Standby
from tests.mesh._util import POLICY


def test_a_client_given_only_a_standby_reaches_the_leader() -> None:
    async def main() -> None:
        server = CoordinatorServer(PolicyStore())
        real = await server.start()
        standby = Standby(real)
        await standby.start()
        client = CoordinatorClient(standby.addr, timeout_s=5.0)
        try:
            assert (await client.put(POLICY)).generation == 1
            assert client.addr == real and standby.calls == {"Put": 1}
            assert len((await client.list()).policies) == 1
            async for snap in client.watch(0):  # a watch follows it too
                assert snap.revision >= 1
                break
            assert standby.calls == {"Put": 1}  # asked once: the leader is known after
        finally:
            await client.close()
            await standby.stop()
            await server.stop()

    asyncio.run(main())


@pytest.fixture
def standby_and_leader() -> Iterator[tuple[str, str]]:
    """A coordinator and a standby naming it, served from a thread of their own."""
    loop = asyncio.new_event_loop()
    ready: list[tuple[str, str]] = []
    server = CoordinatorServer(PolicyStore())
    standby: list[Standby] = []

    async def start() -> None:
        real = await server.start()
        await server_put(real)
        s = Standby(real)
        await s.start()
        standby.append(s)
        ready.append((s.addr, real))

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield ready[0]
    finally:

        async def stop() -> None:
            await standby[0].stop()
            await server.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def server_put(addr: str) -> None:
    client = CoordinatorClient(addr, timeout_s=5.0)
    try:
        await client.put(POLICY)
    finally:
        await client.close()


@pytest.mark.slow
def test_mesh_policy_list_at_a_standby_answers_from_the_leader(
    standby_and_leader: tuple[str, str],
) -> None:
    standby, _leader = standby_and_leader
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "policy", "list", "--coordinator", standby],
        env=dict(os.environ, RATEMESH_API_KEY="any-key-the-test-coordinator-takes"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "read_iops" in out.stdout and "acme" in out.stdout, out.stdout


def test_a_follower_learns_at_most_addrs_learned_max_leaders() -> None:
    f = LeaderFollower(("127.0.0.1:1",))
    for i in range(ADDRS_LEARNED_MAX + 3):
        hint = {"reason": "not_leader", "leader": f"127.0.0.1:{100 + i}"}
        f.moved(f.current, CallFailed(grpc.StatusCode.UNAVAILABLE, "not the leader", hint))
    assert len(f.addrs) == 1 + ADDRS_LEARNED_MAX
    fresh = LeaderFollower(("127.0.0.1:1",))
    assert not fresh.learn("http://127.0.0.1:2/") and fresh.addrs == ("127.0.0.1:1",)

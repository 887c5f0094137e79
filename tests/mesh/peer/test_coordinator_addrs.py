"""CoordinatorClient with several governord addresses: unary calls go on past an
address nothing listens on and follow the leader a standby names (asked once), are resent
round the list until their timeout when nothing answers, a watch whose
stream breaks reopens on the next address without the consumer noticing, and a mesh node
configured with a list of addresses gets its policies through whichever one leads."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from bench._procs import free_port
from mesh.coordinator import PolicySnapshot, PolicyStore
from mesh.core.verdict import Reason
from mesh.errors import ConfigError, PeerUnavailable
from mesh.node import Mesh
from mesh.peer import CoordinatorClient
from mesh.testing.coordinator import CoordinatorServer
from tests.governor._standby import Standby
from tests.mesh._util import POLICY, until


def _dead() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens there


def test_dead_then_real_lists_and_puts() -> None:
    async def main() -> None:
        server = CoordinatorServer(PolicyStore())
        real = await server.start()
        client = CoordinatorClient(f"{_dead()},{real}", timeout_s=2.0)
        try:
            assert (await client.list()).revision == 0
            assert client.addr == real and client.switches == 1
            assert (await client.put(POLICY)).generation == 1
            snap = await client.list()
            assert [p.generation for p in snap.policies] == [1]
            assert client.switches == 1  # it stayed with the one that answered
        finally:
            await client.close()
            await server.stop()

    asyncio.run(main())


def test_a_standby_is_asked_once_and_its_leader_is_followed_past_a_dead_address() -> None:
    async def main() -> None:
        server = CoordinatorServer(PolicyStore())
        real = await server.start()
        standby = Standby(real)
        await standby.start()
        client = CoordinatorClient([standby.addr, _dead(), real], timeout_s=2.0)
        try:
            assert (await client.put(POLICY)).generation == 1
            assert standby.calls == {"Put": 1}
            assert client.addr == real and client.switches == 1  # no detour, no loop
            assert len((await client.list()).policies) == 1
            assert standby.calls == {"Put": 1}
        finally:
            await client.close()
            await standby.stop()
            await server.stop()

    asyncio.run(main())


def test_every_address_down_is_resent_until_the_timeout_then_peer_unavailable() -> None:
    async def main() -> None:
        client = CoordinatorClient([_dead(), _dead(), _dead()], timeout_s=0.5)
        try:
            began = time.monotonic()
            with pytest.raises(PeerUnavailable):
                await client.list()
            assert time.monotonic() - began >= 0.45  # not once round and out
            assert client.switches > 3  # round the list, more than once
            with pytest.raises(PeerUnavailable):
                async for _ in client.watch(0):
                    raise AssertionError("nothing listens: no snapshot")
        finally:
            await client.close()

    asyncio.run(main())


def test_bad_addresses_are_a_config_error_naming_addr() -> None:
    for bad in ("", "a:1,,b:2", "nowhere", ["a:1", 7]):
        with pytest.raises(ConfigError) as err:
            CoordinatorClient(bad)  # type: ignore[arg-type]
        assert err.value.field.startswith("addr"), err.value


def test_a_watch_reopens_on_the_next_address_when_its_stream_breaks() -> None:
    """Two coordinators on one store stand for two governords on one record: the watch
    starts at the standby (which names the first), the first goes away, and the same watch
    carries on from the second, from the revision it had."""

    async def main() -> None:
        store = PolicyStore()
        first, second = CoordinatorServer(store), CoordinatorServer(store)
        a, b = await first.start(), await second.start()
        standby = Standby(a)
        await standby.start()
        client = CoordinatorClient([standby.addr, a, b], timeout_s=2.0)
        seen: list[PolicySnapshot] = []

        async def watch() -> None:
            async for snap in client.watch(0):
                seen.append(snap)

        task = asyncio.create_task(watch())
        try:
            store.put(POLICY)
            await until(lambda: bool(seen) and seen[-1].revision == 1, 5, "revision 1")
            assert standby.calls == {"Watch": 1} and client.addr == a
            await first.stop()  # the leader goes away under the open watch
            store.put(dict(POLICY, target_rate=500))
            await until(lambda: seen[-1].revision == 2, 5, "revision 2, through the second")
            assert not task.done() and client.addr == b
            assert max(p.generation for p in seen[-1].policies) == 2
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()
            await standby.stop()
            await second.stop()

    asyncio.run(main())


def test_a_node_configured_with_a_list_admits_under_the_leaders_generations() -> None:
    async def main() -> None:
        store = PolicyStore()
        server = CoordinatorServer(store)
        real = await server.start()
        standby = Standby(real)
        await standby.start()
        addrs = [_dead(), standby.addr, real]
        cfg = {"member_id": "a", "policies": {"coordinator": {"addr": addrs, "poll_ttl_ms": 100}}}
        try:
            async with Mesh(cfg) as mesh:
                assert mesh.try_admit("acme", "read_iops").reason is Reason.POLICY_UNKNOWN
                store.put(POLICY)
                await until(lambda: mesh.try_admit("acme", "read_iops").allowed, 5, "policy")
        finally:
            await standby.stop()
            await server.stop()

    asyncio.run(main())

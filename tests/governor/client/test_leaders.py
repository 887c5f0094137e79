"""The SDK with several governord addresses: calls follow the leader a standby
names (once, not in a loop), skip an address nothing listens on, resend a call that straddled
a takeover under its request id (applied once), keep the session's token across a takeover,
and raise LeaderChanged for an acquire whose wait a leader change cut."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.client import Client, LeaderChanged, Unavailable
from governor.client._rpc import Dial
from tests.governor._daemon import KEYS, Daemon, free_port, running
from tests.governor._standby import Relay, Standby

A = KEYS["KEY_A"]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from running("sqlite", tmp_path)


async def _until(pred: object, what: str, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_dial_names_one_address_or_several(monkeypatch: pytest.MonkeyPatch) -> None:
    one = Dial("127.0.0.1:7443", "k")
    assert one.addr == "127.0.0.1:7443" and one.addrs == ("127.0.0.1:7443",)
    many = Dial("a:1, b:2", "k")
    assert many.addrs == ("a:1", "b:2") and many.addr == "a:1,b:2"
    with pytest.raises(ValueError, match="addr: names a:1 twice"):
        Dial("a:1, b:2,a:1", "k")
    assert Dial.from_env(["a:1", "c:3"], "k").addrs == ("a:1", "c:3")
    monkeypatch.setenv("GOVERNOR_ADDR", "x:1,y:2")
    assert Dial.from_env(api_key="k").addrs == ("x:1", "y:2")
    monkeypatch.setenv("GOVERNOR_ADDR", "x:1,,y:2")
    with pytest.raises(ValueError, match="GOVERNOR_ADDR: 'x:1,,y:2' has an empty address"):
        Dial.from_env(api_key="k")
    assert issubclass(LeaderChanged, Unavailable)


@pytest.mark.slow
def test_a_standby_is_asked_once_and_a_dead_address_is_skipped(daemon: Daemon) -> None:
    async def scenario() -> None:
        standby = Standby(daemon.addr)
        await standby.start()
        dead = f"127.0.0.1:{free_port()}"
        try:
            for multiplex in (True, False):
                # the standby names the leader: straight there, past the dead address
                for addrs in (f"{standby.addr},{dead},{daemon.addr}", f"{dead},{daemon.addr}"):
                    before = standby.refused
                    async with Client(addrs, A, ttl_ms=600, multiplex=multiplex) as client:
                        async with client.task("work", quotas={"http": 10}) as task:
                            await client.consume("http", 2)
                            await _until(lambda c=client: c.heartbeats_ok >= 2, "heartbeats")
                            info = await client.get_node(task.node_id)
                            assert info["used"] == {"http": 2}
                        assert client._rpc.leader == daemon.addr
                        assert client._rpc.switches == 1  # one move: no loop, no detour
                        assert client.lost is None
                    asked = standby.refused - before
                    assert asked == (1 if addrs.startswith(standby.addr) else 0)
            assert standby.calls == {"OpenSession": 2}
        finally:
            await standby.stop()

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_call_that_straddles_a_takeover_is_applied_once(daemon: Daemon) -> None:
    """The relay leads (passes calls through), then is deposed under a consume: the charge is
    made, the reply is not_leader, the client resends to the leader under the same request
    id, and governord, which keeps request ids in the record, charges it once."""

    async def scenario() -> None:
        for multiplex in (True, False):
            relay = Relay(daemon.addr)
            await relay.start()
            try:
                async with Client(f"{relay.addr},{daemon.addr}", A, multiplex=multiplex) as c:
                    async with c.task("straddle", quotas={"http": 100}) as task:
                        assert c._rpc.leader == relay.addr  # the relay answered as leader
                        relay.deposed = True
                        await c.consume("http", 3)
                        assert relay.relayed["Consume"] == 1  # the effect happened there
                        assert c._rpc.leader == daemon.addr
                        assert (await c.get_node(task.node_id))["used"] == {"http": 3}
            finally:
                await relay.stop()

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_takeover_keeps_the_session_and_cuts_a_waiting_acquire(daemon: Daemon) -> None:
    """governord on the first address is killed; the same record is served again on the
    third (the new leader), with a standby naming it in between. The session's heartbeats and
    calls move there with the same token; an acquire waiting on the old leader raises
    LeaderChanged rather than being queued again behind the caller's back."""
    first = daemon.addr
    standby = Standby("")  # the new leader's address, once it is known

    async def scenario() -> None:
        new_port = free_port()
        new_leader = f"127.0.0.1:{new_port}"
        standby.leader = new_leader
        await standby.start()
        addrs = f"{first},{standby.addr},{new_leader}"
        try:
            async with Client(addrs, A, ttl_ms=6000) as client:
                async with client.task("pool", limits={"db": 1}, quotas={"http": 100}) as task:
                    held = await client.acquire_at(task.node_id, "db")
                    waiting = asyncio.create_task(client.acquire_at(task.node_id, "db"))
                    end = time.monotonic() + 10
                    while (await client.get_node(task.node_id))["waiting"].get("db", 0) < 1:
                        assert time.monotonic() < end, "the second acquire never queued"
                        await asyncio.sleep(0.02)
                    await asyncio.to_thread(daemon.kill)
                    with pytest.raises(LeaderChanged, match="the leader changed while the acq"):
                        await waiting
                    daemon.port, daemon.addr = new_port, new_leader
                    daemon.config["listen"] = new_leader
                    await asyncio.to_thread(daemon.start)
                    session = client.session_id
                    await client.consume("http", 1)  # resent until the new leader answers
                    assert client._rpc.leader == new_leader
                    assert standby.calls["Multiplex"] >= 1  # the standby named the leader
                    ok = client.heartbeats_ok
                    await _until(lambda: client.heartbeats_ok > ok, "a heartbeat", 10)
                    assert client.session_id == session and client.lost is None
                    assert await client.release(held) is True  # the lease, in the record
                    again = await client.acquire_at(task.node_id, "db", timeout=5)
                    await client.release(again)
                    assert (await client.get_node(task.node_id))["used"] == {"http": 1}
        finally:
            await standby.stop()

    asyncio.run(scenario())

"""The SDK against a real governord (SQLite): the current task in a contextvar, consume,
acquire with latency and overload, Group fan-out under a lease limit, retry spending the retry
budget, the httpx transports, and the sync wrapper."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from governor import client as sdk
from governor.client import (
    Client,
    Denied,
    GovernedAsyncTransport,
    GovernedTransport,
    Group,
    NodeEnded,
    ScopeError,
    SyncClient,
    acquire,
    consume,
    current_task,
    retry,
)
from tests.governor._daemon import KEYS, Daemon, running

A, B = KEYS["KEY_A"], KEYS["KEY_B"]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from running("sqlite", tmp_path)


def test_public_api_is_pinned() -> None:
    assert set(sdk.__all__) == {
        "AcquireTimeout", "AuthError", "Client", "Denied", "GovernedAsyncTransport",
        "GovernedTransport", "GovernorClientError", "Group", "LeaderChanged", "Lease",
        "LeaseEnded", "NodeEnded",
        "RequestError", "ScopeError", "SessionLost", "Slot", "StrictCredit", "SyncClient",
        "SyncTask", "Task",
        "Unavailable", "acquire", "consume", "cooldown", "current_sync_task", "current_task",
        "retry", "slot", "validate",
    }  # fmt: skip


@pytest.mark.slow
def test_task_tree_consume_acquire_and_denial(daemon: Daemon) -> None:
    async def scenario() -> None:
        async with Client(daemon.addr, A, ttl_ms=3000) as client:
            async with client.task("crawl", quotas={"http": 5}) as task:
                assert current_task() is task

                async def deep_library_code() -> int:
                    await consume("http")  # no handle: the contextvar carries the task
                    return current_task().node_id

                async with client.task("page") as sub:
                    assert await deep_library_code() == sub.node_id
                async with acquire("db") as lease:
                    assert await sdk.validate(lease.lease_id)
                    lease.overloaded = True
                with pytest.raises(Denied) as denied:
                    await consume("http", 10)
                assert denied.value.denial["node_id"] == task.node_id
                assert denied.value.denial["used"] == 1 and denied.value.denial["limit"] == 5
                info = await client.get_node(task.node_id)
                assert info["used"] == {"http": 1} and info["held"] == {}
                assert [c for c in info["children"]] == [sub.node_id]
            assert (await client.get_node(task.node_id))["state"] == "done"
            with pytest.raises(RuntimeError):
                async with client.task("fails") as failing:
                    raise RuntimeError("boom")
            assert (await client.get_node(failing.node_id))["state"] == "cancelled"
            with pytest.raises(NodeEnded):
                await client.consume_at(failing.node_id, "http")
            async with Client(daemon.addr, B) as other:
                with pytest.raises(ScopeError):
                    await other.consume_at(task.node_id, "http")

    asyncio.run(scenario())


@pytest.mark.slow
def test_group_fans_out_under_the_lease_limit(daemon: Daemon) -> None:
    async def scenario() -> None:
        async with Client(daemon.addr, A) as client:
            async with client.task("fan", limits={"agents": 2}) as task:
                running = peak = 0

                async def agent(i: int) -> int:
                    nonlocal running, peak
                    running += 1
                    peak = max(peak, running)
                    await asyncio.sleep(0.02)
                    await consume("http")
                    running -= 1
                    return i

                async with Group("agents") as g:
                    tasks = [g.spawn(f"agent-{i}", functools.partial(agent, i)) for i in range(8)]
                assert [t.result() for t in tasks] == list(range(8))
                assert 1 <= peak <= 2
                info = await client.get_node(task.node_id)
                assert info["used"] == {"http": 8} and len(info["children"]) == 8
                assert info["held"] == {}

    asyncio.run(scenario())


@pytest.mark.slow
def test_retry_spends_the_budget_and_stops(daemon: Daemon) -> None:
    async def scenario() -> None:
        async with Client(daemon.addr, A) as client:
            async with client.task("call", quotas={"retry": 1}) as task:
                calls = 0

                async def down() -> None:
                    nonlocal calls
                    calls += 1
                    raise ConnectionError("downstream is down")

                async def layer(inner: object) -> None:
                    await retry(inner, attempts=3)  # type: ignore[arg-type]

                async def three_layers() -> None:
                    await retry(lambda: layer(lambda: layer(down)), attempts=3)

                with pytest.raises(ConnectionError):
                    await three_layers()
                assert calls == 2  # 27 without a budget
                info = await client.get_node(task.node_id)
                assert info["used"] == {"retry": 1}

                async def ok_on_second() -> str:
                    nonlocal calls
                    calls += 1
                    if calls % 2:
                        raise ConnectionError
                    return "ok"

            async with client.task("call2", quotas={"retry": 5}):
                calls = 0
                assert await retry(ok_on_second) == "ok"
                assert calls == 2

    asyncio.run(scenario())


@pytest.mark.slow
def test_httpx_transports_charge_and_report_overload(daemon: Daemon) -> None:
    statuses = iter([200, 429, 503, 200])

    def downstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(next(statuses))

    async def scenario() -> None:
        async with Client(daemon.addr, A) as client:
            async with client.task("http", quotas={"http": 3}) as task:
                transport = GovernedAsyncTransport(httpx.MockTransport(downstream))
                async with httpx.AsyncClient(transport=transport) as h:
                    got = [(await h.get("http://svc/")).status_code for _ in range(3)]
                    assert got == [200, 429, 503]
                    with pytest.raises(Denied):
                        await h.get("http://svc/")
                info = await client.get_node(task.node_id)
                assert info["used"] == {"http": 3} and info["held"] == {}

    asyncio.run(scenario())


@pytest.mark.slow
def test_sync_wrapper(daemon: Daemon) -> None:
    with SyncClient(daemon.addr, A) as client:
        with client.task("sync-job", quotas={"http": 2}) as task:
            client.consume("http")
            with client.acquire("db") as lease:
                assert client.validate(lease.lease_id)
            transport = GovernedTransport(httpx.MockTransport(lambda r: httpx.Response(200)))
            with httpx.Client(transport=transport) as h:
                assert h.get("http://svc/").status_code == 200
                with pytest.raises(Denied):
                    h.get("http://svc/")
            info = client.get_node(task.node_id)
            assert info["used"] == {"http": 2} and info["held"] == {}
        assert client.get_node(task.node_id)["state"] == "done"


@pytest.mark.slow
def test_task_deadline_cancels_the_block_and_ends_the_node(daemon: Daemon) -> None:
    async def scenario() -> None:
        async with Client(daemon.addr, A) as client:
            with pytest.raises(TimeoutError):
                async with client.task("slow", timeout=0.3) as task:
                    await asyncio.sleep(10)
            info = await client.get_node(task.node_id)
            assert info["state"] in ("deadline_exceeded", "cancelled")
            assert info["deadline_ms"] is not None
            with pytest.raises(NodeEnded):
                await client.consume_at(task.node_id, "http")

    asyncio.run(scenario())

"""Named bounds on a node's resources (issue 12): a batch of many unknown keys is fetched by
one task under a bound and every fetch is answered; big batches are applied in slices; the
memory of refused messages is collected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio

from bench._procs import free_port
from mesh.coordinator import PolicySnapshot, PolicyStore
from mesh.core.messages import ReportBatch, encode
from mesh.core.owner._owner import FETCHING_MAX
from mesh.core.policy import Metric, RateKey
from mesh.errors import PeerError
from mesh.node import Mesh
from mesh.node._driver import NodeDriver
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from mesh.peer._wire import SCHEMA
from tests.mesh._util import POLICY, until

EPOCH = 7  # the hostile member's worker_epoch
# Tasks a flood may add to the loop: this test's watcher and client, the server's stream and
# writer; never one per key (there were 65,536 for one batch, issue 12).
TASKS_ADDED_MAX = 12


def _config(**extra: Any) -> dict[str, Any]:
    """A node `n` in the static ring {n, good}; `good` never runs (its port is closed), so
    this test can send as a member."""
    addr = f"127.0.0.1:{free_port()}"
    return dict(
        {
            "member_id": "n",
            "listen": addr,
            "shutdown_drain_ms": 200,
            "membership": {
                "source": "static",
                "members": {"n": addr, "good": f"127.0.0.1:{free_port()}"},
            },
            "policies": {"inline": [POLICY]},
        },
        **extra,
    )


def owned_keys(node: Mesh, n: int, prefix: str = "u") -> list[RateKey]:
    """`n` keys of tenants no policy names, owned by the node in its ring {n, good}."""
    assert set(node.ring.members) == {"n", "good"}, node.ring.members
    keys: list[RateKey] = []
    i = 0
    while len(keys) < n:
        key = RateKey(f"{prefix}{i}", Metric.READ_IOPS, 1)
        if node.ring.owns("n", key):
            keys.append(key)
        i += 1
    return keys


def report_batch(node: Mesh, keys: list[RateKey], seq: int = 1) -> bytes:
    n = len(keys)
    return encode(
        ReportBatch(
            "good", node.ring.epoch, EPOCH, tuple(keys), (seq,) * n, (1,) * n, (0,) * n, (1,) * n
        )
    )


async def joined(node: Mesh) -> Mesh:
    """The node, once its ring holds `good` too (membership is adopted after start)."""
    await until(lambda: len(node.ring) == 2, 5, "the ring {n, good}")
    return node


async def send(addr: str, payloads: list[bytes], replies_min: int = 1) -> int:
    """Send `payloads` on one stream as member `good`; read replies until `replies_min`
    came (or the stream went quiet for a second). Returns the replies read."""
    md = ((MEMBER_MD, "good"), (SCHEMA_MD, SCHEMA), (EPOCH_MD, str(EPOCH)))
    got = 0
    async with aio.insecure_channel(addr) as ch:
        call = ch.stream_stream(EXCHANGE)(metadata=md, timeout=30)
        for p in payloads:
            await call.write(p)
        try:
            while got < replies_min:
                reply = await asyncio.wait_for(call.read(), 1.0)
                if reply is aio.EOF:
                    break
                got += 1
        except TimeoutError:
            pass
        call.cancel()
    return got


async def _watch_tasks(peak: list[int], fetching: list[int], driver: NodeDriver) -> None:
    while True:
        peak[0] = max(peak[0], len(asyncio.all_tasks()))
        fetching[0] = max(fetching[0], len(driver.member.owner._fetching))
        await asyncio.sleep(0)


async def _flood_and_settle(node: Mesh, keys: list[RateKey]) -> tuple[int, int, int]:
    """Send one batch of `keys`, watching the loop's task count and the owner's fetch set;
    (tasks added at most, largest fetch set, replies)."""
    driver = node._require()
    base = len(asyncio.all_tasks())
    peak, fetching = [base], [0]
    watcher = asyncio.create_task(_watch_tasks(peak, fetching, driver))
    try:
        replies = await send(node.address, [report_batch(node, keys)])
        await until(lambda: not driver.member.owner._fetching, 10, "every fetch answered")
    finally:
        watcher.cancel()
    return peak[0] - base, fetching[0], replies


class CountingStore(PolicyStore):
    """The in-process coordinator, counting its lists; `fail` makes them raise."""

    def __init__(self) -> None:
        super().__init__()
        self.lists = 0
        self.fail: Exception | None = None

    async def list(self) -> PolicySnapshot:
        self.lists += 1
        if self.fail is not None:
            raise self.fail
        return await super().list()

    async def watch(self, after_revision: int) -> AsyncIterator[PolicySnapshot]:
        await asyncio.Event().wait()  # never: the fetches are what is under test
        yield self.snapshot()


# -- policy fetches ---------------------------------------------------------------------------


def test_unknown_keys_without_a_coordinator_start_no_task_and_are_all_answered() -> None:
    async def main() -> None:
        async with Mesh(_config()) as node:
            keys = owned_keys(await joined(node), 20_000)
            added, fetching, replies = await _flood_and_settle(node, keys)
            assert replies >= 1
            assert added <= TASKS_ADDED_MAX, added
            assert fetching == FETCHING_MAX
            assert node._require().fetch_polls == 0

    asyncio.run(main())


def test_unknown_keys_are_fetched_with_one_poll_and_learned_ones_apply() -> None:
    async def main() -> None:
        store = CountingStore()
        async with Mesh(_config(), policy_source=store) as node:
            keys = owned_keys(await joined(node), 5000)
            learn = keys[:10]
            for k in learn:
                store.put({**POLICY, "tenant_id": k.tenant_id})
            lists = store.lists
            added, fetching, _ = await _flood_and_settle(node, keys)
            assert added <= TASKS_ADDED_MAX, added
            assert fetching == FETCHING_MAX
            driver = node._require()
            assert 1 <= driver.fetch_polls <= 3 and store.lists - lists == driver.fetch_polls
            assert all(node._require().member.policies.get(k) is not None for k in learn)
            await send(node.address, [report_batch(node, learn, seq=2)])
            owner = driver.member.owner
            await until(lambda: all(k in owner.keys for k in learn), 5, "learned keys open")

    asyncio.run(main())


def test_a_failing_coordinator_still_answers_every_fetch() -> None:
    async def main() -> None:
        for fail in (PeerError("coordinator", "unreachable"), RuntimeError("bug")):
            store = CountingStore()
            async with Mesh(_config(), policy_source=store) as node:
                store.fail = fail  # from now on: the node started with its answer
                keys = owned_keys(await joined(node), 3000)
                added, fetching, _ = await _flood_and_settle(node, keys)
                assert added <= TASKS_ADDED_MAX and fetching == FETCHING_MAX
                assert node._require().fetch_polls >= 1

    asyncio.run(main())


def test_fetches_queued_or_held_when_the_node_closes_are_answered() -> None:
    async def main() -> None:
        store = CountingStore()
        node = Mesh(_config(), policy_source=store)
        await node.astart()
        driver = node._require()
        await send(node.address, [report_batch(node, owned_keys(await joined(node), 3000))])
        await until(lambda: driver.fetch_polls >= 1, 5, "a fetch poll")
        assert driver.member.owner._fetching  # held for the retry delay
        await node.aclose()
        assert not driver.member.owner._fetching
        assert not driver._fetch_queue and not driver._fetch_held

    asyncio.run(main())

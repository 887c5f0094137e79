"""Named bounds on a node's resources: a batch of many unknown keys is fetched by
one task under a bound and every fetch is answered; big batches are applied in slices; the
memory of refused messages is collected."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from bench._procs import free_port, read_ready, spawn, stop, write_config
from mesh.coordinator import PolicySnapshot, PolicyStore
from mesh.core.messages import REPORT_ROWS_MAX, ReportBatch, SnapshotBatch, decode, encode
from mesh.core.owner._owner import FETCHING_MAX
from mesh.core.policy import Metric, RateKey
from mesh.errors import PeerError
from mesh.node import Mesh
from mesh.node._driver import NodeDriver
from mesh.node._ingest import BACKLOG_ROWS_MAX, REPORT_SLICE_ROWS, SLICE_ROWS_MIN
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from mesh.peer._wire import SCHEMA
from tests.mesh._util import POLICY, until

EPOCH = 7  # the hostile member's worker_epoch
# Tasks a flood may add to the loop: this test's watcher and client, the server's stream and
# writer; never one per key (there were 65,536 for one batch once).
TASKS_ADDED_MAX = 12


# Every tenant, at a rate no test reaches: a flood of known keys.
ANY_TENANT = {
    **POLICY,
    "tenant_id": "*",
    "target_rate": 10**9,
    "global_burst": 10**9,
    "local_burst_cap": 10**6,
}


def _config(policies: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
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
            "policies": {"inline": [POLICY] if policies is None else policies},
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


def reports(node: Mesh, keys: list[RateKey], seq: int = 1, sender: str = "good") -> ReportBatch:
    """One unit of each key, at sequence `seq`."""
    n = len(keys)
    return ReportBatch(
        sender, node.ring.epoch, EPOCH, tuple(keys), (seq,) * n, (1,) * n, (0,) * n, (1,) * n
    )


def report_batches(node: Mesh, keys: list[RateKey], seq: int = 1) -> list[bytes]:
    """The keys' reports as batches of the largest legal size (REPORT_ROWS_MAX rows)."""
    step = REPORT_ROWS_MAX
    return [encode(reports(node, keys[i : i + step], seq)) for i in range(0, len(keys), step)]


BURST = 64  # batches of the largest size, one after another on one stream: 16,384 rows
ROWS = BURST * REPORT_ROWS_MAX


async def joined(node: Mesh) -> Mesh:
    """The node, once its ring holds `good` too (membership is adopted after start)."""
    await until(lambda: len(node.ring) == 2, 5, "the ring {n, good}")
    return node


async def send(
    addr: str, payloads: list[bytes], rows_min: int = 1, quiet_s: float = 3.0
) -> list[SnapshotBatch]:
    """Send `payloads` on one stream as member `good`; read replies until they carry
    `rows_min` rows (snapshots or rejections), or the stream went quiet for `quiet_s`."""
    md = ((MEMBER_MD, "good"), (SCHEMA_MD, SCHEMA), (EPOCH_MD, str(EPOCH)))
    got: list[SnapshotBatch] = []
    rows = 0
    async with aio.insecure_channel(addr) as ch:
        call = ch.stream_stream(EXCHANGE)(metadata=md, timeout=60)
        for p in payloads:
            await call.write(p)
        try:
            while rows < rows_min:
                reply = await asyncio.wait_for(call.read(), quiet_s)
                if reply is aio.EOF:
                    break
                batch = decode(reply)
                assert isinstance(batch, SnapshotBatch)
                got.append(batch)
                rows += len(batch.keys) + len(batch.rejections)
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
    """Send `keys` in batches of the largest size, watching the loop's task count and the
    owner's fetch set; (tasks added at most, largest fetch set, replies)."""
    driver = node._require()
    base = len(asyncio.all_tasks())
    peak, fetching = [base], [0]
    watcher = asyncio.create_task(_watch_tasks(peak, fetching, driver))
    try:
        replies = await send(node.address, report_batches(node, keys), len(keys))
        await until(lambda: not driver.member.owner._fetching, 10, "every fetch answered")
    finally:
        watcher.cancel()
    return peak[0] - base, fetching[0], sum(len(r.rejections) for r in replies)


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
            assert replies == len(keys)  # every key refused, POLICY_UNKNOWN
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
            await send(node.address, report_batches(node, learn, seq=2))
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
        await send(node.address, report_batches(node, owned_keys(await joined(node), 3000)))
        await until(lambda: driver.fetch_polls >= 1, 5, "a fetch poll")
        assert driver.member.owner._fetching  # held for the retry delay
        await node.aclose()
        assert not driver.member.owner._fetching
        assert not driver.fetches._queue and not driver.fetches._held

    asyncio.run(main())


# -- slices -----------------------------------------------------------------------------------


def test_a_burst_of_the_largest_batches_is_applied_in_slices_with_the_loop_served_between() -> None:
    """Every row applied once and acknowledged (one reply per slice); between two slices
    the loop runs other callbacks (here a watcher that counts its turns). A batch larger
    than REPORT_ROWS_MAX is refused by the codec (tests/mesh/core/test_messages.py)."""

    async def main() -> None:
        async with Mesh(_config([POLICY, ANY_TENANT])) as node:
            driver = node._require()
            keys = owned_keys(await joined(node), ROWS)
            turns = [0]

            async def watch() -> None:
                while True:
                    if driver.ingest._backlog:
                        turns[0] += 1
                    await asyncio.sleep(0)

            watcher = asyncio.create_task(watch())
            replies = await send(node.address, report_batches(node, keys), ROWS)
            watcher.cancel()
            acked = [k for r in replies for k, a in zip(r.keys, r.acks, strict=True) if a == 1]
            assert len(set(acked)) == len(acked) and set(acked) <= set(keys)
            # Replies are best effort: a reply that finds the stream's queue full is dropped
            # (the worker would resend its reports); every other one acknowledges its slice.
            dropped = driver.transport.stats()["snapshots_dropped_no_stream"]
            assert len(acked) >= ROWS - dropped * REPORT_ROWS_MAX
            assert dropped or len(acked) == ROWS
            assert all(len(r.keys) <= REPORT_ROWS_MAX for r in replies)
            assert driver.member.owner.applied_units == ROWS
            assert 1 <= driver.reports_sliced <= BURST and driver.reports_shed == 0
            assert turns[0] >= ROWS // REPORT_ROWS_MAX - 2, turns
            assert not driver.ingest._backlog

    asyncio.run(main())


def test_slices_keep_a_senders_order_take_turns_and_a_full_backlog_sheds() -> None:
    async def main() -> None:
        async with Mesh(_config([POLICY, ANY_TENANT])) as node:
            driver = node._require()
            owner = driver.member.owner
            keys = owned_keys(await joined(node), REPORT_ROWS_MAX)
            driver.ingest.backlog_rows_max = 2 * REPORT_ROWS_MAX + 1  # a small backlog, to fill
            # A large batch and, behind it, a small one with the next sequence of two of its
            # keys: the small one waits for the large one's slices, so both apply in order.
            driver.deliver(reports(node, keys, seq=1))
            driver.deliver(reports(node, keys[-2:], seq=2))
            assert driver.ingest._backlog["good"].rows == REPORT_ROWS_MAX + 2
            assert driver.busy("good") and not driver.busy("n")
            # The backlog is full at backlog_rows_max rows: the next batch is shed.
            driver.deliver(reports(node, keys, seq=3))
            assert driver.reports_shed == 1
            # Another sender's backlog takes turns with good's, a slice each.
            driver.deliver(reports(node, keys, sender="n"))
            before = {s: b.rows for s, b in driver.ingest._backlog.items()}
            driver.ingest._next_slice()
            driver.ingest._next_slice()
            after = {s: b.rows for s, b in driver.ingest._backlog.items()}
            # The first slice has REPORT_SLICE_ROWS rows (no pace known yet); the next ones as
            # many as the last one's pace allows in SLICE_TARGET_NS, within
            # [SLICE_ROWS_MIN, REPORT_ROWS_MAX].
            assert before["good"] - after["good"] == REPORT_SLICE_ROWS
            assert SLICE_ROWS_MIN <= before["n"] - after["n"] <= REPORT_ROWS_MAX
            await until(lambda: not driver.ingest._backlog, 60, "the backlog applied")
            good = [ks.reporters["good"].watermark for ks in owner.keys.values()]
            assert sorted(good)[-2:] == [2, 2] and good.count(1) == REPORT_ROWS_MAX - 2
            assert owner.duplicates == 0
            assert BACKLOG_ROWS_MAX >= 512 * REPORT_ROWS_MAX  # an honest burst fits many times

    asyncio.run(main())


def test_the_owners_pace_decides_whether_a_legal_batch_is_applied_whole_or_in_slices() -> None:
    """At a fast pace (known keys) a batch of REPORT_ROWS_MAX rows is applied whole, with one
    reply; when an apply was slow (opening keys, a pause), the next batch is cut into slices of
    at least SLICE_ROWS_MIN rows, and a fast slice brings the whole batch back."""

    async def main() -> None:
        async with Mesh(_config([POLICY, ANY_TENANT])) as node:
            driver = node._require()
            owner = driver.member.owner
            keys = owned_keys(await joined(node), REPORT_ROWS_MAX)
            driver.ingest._slice_rows = REPORT_ROWS_MAX  # as a fast pace leaves it
            driver.deliver(reports(node, keys, seq=1))
            assert not driver.ingest._backlog and driver.reports_sliced == 0
            assert owner.applied_units == REPORT_ROWS_MAX
            # A slow apply (2 ms for a batch) sets the next slice to SLICE_ROWS_MIN rows.
            fast = driver.ingest.apply

            def slow(message: Any) -> None:
                time.sleep(0.002)
                fast(message)

            driver.ingest.apply = slow  # type: ignore[method-assign]
            driver.ingest._slice_rows = REPORT_ROWS_MAX  # opening the keys above was slower
            driver.deliver(reports(node, keys[:REPORT_SLICE_ROWS], seq=2))
            assert driver.ingest._slice_rows == SLICE_ROWS_MIN
            driver.ingest.apply = fast  # type: ignore[method-assign]
            driver.deliver(reports(node, keys, seq=3))
            assert (
                driver.reports_sliced == 1
                and driver.ingest._backlog["good"].rows == REPORT_ROWS_MAX
            )
            driver.ingest._next_slice()
            assert driver.ingest._backlog["good"].rows == REPORT_ROWS_MAX - SLICE_ROWS_MIN
            await until(lambda: not driver.ingest._backlog, 10, "the backlog applied")
            assert owner.applied_units == 3 * REPORT_ROWS_MAX - (
                REPORT_ROWS_MAX - REPORT_SLICE_ROWS
            )
            assert owner.duplicates == 0

    asyncio.run(main())


# -- memory after refused messages ------------------------------------------------------------

REFUSED_MESSAGES = 600  # the count, of 1 MiB each: they held 1.1-1.2 GB
RSS_RETURN_MB = 20  # the target: back within this of the start


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_memory_returns_after_600_refused_1mib_messages_on_a_standalone_node(
    tmp_path: Path,
) -> None:
    """A real `mesh node` process (raised GC thresholds) refuses 600 messages of 1 MiB that
    are not msgpack (INVALID_ARGUMENT); its RSS returns to within 20 MB of its start."""
    addr = f"127.0.0.1:{free_port()}"
    cfg = _config(listen=addr)
    cfg["membership"]["members"]["n"] = addr
    path = write_config(tmp_path / "n.yaml", cfg)
    proc = spawn(["-m", "mesh.cli", "node", "--log-level", "error", "--config", str(path)])
    try:
        read_ready(proc)
        time.sleep(1.0)  # settled: the ring adopted, the first ticks run
        start = _rss_mb(proc.pid)
        md = ((MEMBER_MD, "good"), (SCHEMA_MD, SCHEMA), (EPOCH_MD, str(EPOCH)))
        payload = b"\x00" * (1 << 20)
        codes: dict[grpc.StatusCode, int] = {}
        peak = start
        opts = [("grpc.max_send_message_length", 2 << 20)]
        with grpc.insecure_channel(addr, options=opts) as ch:
            for i in range(REFUSED_MESSAGES):
                call = ch.stream_stream(EXCHANGE)(iter([payload]), metadata=md, timeout=10)
                try:
                    for _ in call:
                        pass
                except grpc.RpcError as exc:
                    codes[exc.code()] = codes.get(exc.code(), 0) + 1
                if i % 50 == 0:
                    peak = max(peak, _rss_mb(proc.pid))
        assert codes == {grpc.StatusCode.INVALID_ARGUMENT: REFUSED_MESSAGES}
        deadline = time.monotonic() + 10
        while (rss := _rss_mb(proc.pid)) > start + RSS_RETURN_MB and time.monotonic() < deadline:
            time.sleep(0.25)
        print(f"rss start {start:.1f} MB, peak {peak:.1f} MB, after {rss:.1f} MB")
        assert rss <= start + RSS_RETURN_MB, (start, peak, rss)
    finally:
        stop(proc)


def test_a_node_applies_its_own_many_reports_whole_and_forgets_the_idle_tenants() -> None:
    """A node that owns its keys reports to itself: 40,000 tenants touched once each are
    all applied and acknowledged, none shed, and then forgotten. Its own reports are
    applied whole, not in slices: behind slices they were resent before their turn and
    the resends filled the backlog (every view stayed unacknowledged, never forgotten)."""
    tenants = 40_000
    policy = dict(POLICY, tenant_id="*")
    cfg = {
        "member_id": "solo",
        "policies": {"inline": [policy]},
        "core": {"views_idle_ms": 200, "idempotency_retention_ms": 500},
    }

    async def main() -> None:
        async with Mesh(cfg) as node:
            driver = node._require()
            for i in range(tenants):
                node.try_admit(f"tenant-{i}", "read_iops")
                if i % 1000 == 999:
                    await asyncio.sleep(0)  # the node ticks, reports and acknowledges
            owner, reporter = driver.member.owner, driver.member.reporter
            await until(lambda: owner.applied_units == tenants, 30, "every report applied")
            await until(lambda: not reporter.gates, 30, "every idle view forgotten")
            assert driver.reports_shed == 0 and not driver.ingest._backlog
            # The node's forget pass also drops the ring's memoised lookups, which hold keys
            # (and their tenants' names) that the core forgot after looking them up again.
            driver.forget_idle(driver.clock_ns())
            assert not driver.member.ring._memo

    asyncio.run(main())

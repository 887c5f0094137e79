"""The asyncio driver of one Member: `mesh.testing.fleet.MemoryFleet`'s loop on real time.

It feeds the sans-I/O Member time (a tick every sync interval, an early flush when the
report threshold is crossed), messages (from the transport) and rings (from membership),
and carries out the effects it returns. In a threaded app `lock` guards the Member, since
`try_admit` runs on the app's threads while this loop runs on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from itertools import repeat
from typing import Any

from mesh.config import Identity, NodeConfig
from mesh.coordinator import PolicyFeed
from mesh.core.admission import Counter
from mesh.core.effects import Effect, FetchPolicy, ReserveCredit, ReturnCredit, Send
from mesh.core.member import Member
from mesh.core.messages import (
    REPORT_ROWS_MAX,
    CellPublish,
    Handover,
    Message,
    ReportBatch,
    SnapshotBatch,
)
from mesh.core.owner._owner import FETCHING_MAX
from mesh.core.policy import Metric, RateKey
from mesh.core.quota import CellTier
from mesh.core.ring import Ring
from mesh.membership import MembershipSource, MembershipView
from mesh.node._credit import CreditDriver
from mesh.node._reload import PolicyReloader
from mesh.node._units import AdmittedUnits
from mesh.peer import Transport
from mesh.telemetry import DECISIONS_IDLE_S, Telemetry

__all__ = ["NodeDriver", "DELAY_TRACK_MAX"]

log = logging.getLogger("mesh.node")
CLOSE_STEP_S = 2.0  # the longest one step of a graceful leave may take past its drain
DELAY_TRACK_MAX = 100_000  # keys whose report delay is being timed; cleared when full
# Per-key and per-tenant maps of the node (delay timing, telemetry's decision counts) drop
# what was untouched for this long, once per this long: an idle tenant is gone within 2x.
FORGET_IDLE_NS = int(DECISIONS_IDLE_S * 1_000_000_000)
TRIM_AFTER = 10_000  # a forget pass that dropped this many tenants gives the heap back too
DELAYS_KEPT = 512  # recent report delays, for d in the envelope estimate
NS = 1_000_000_000
REFUSED_LOG_NS = NS  # peers' refused reports: one warning per this long, the rest at debug
# Policy fetches (issue 12): the owner's FetchPolicy effects queue here (deduplicated) for
# one fetcher task, which answers every queued key with one coordinator poll. The owner asks
# for at most FETCHING_MAX keys at once, so the queue holds no more; a key still unknown
# after its poll (or with no coordinator to ask) is held back for a retry delay before the
# owner may ask again, in a deque bounded by the same number.
FETCH_QUEUE_MAX = FETCHING_MAX
FETCH_TIMEOUT_S = 5.0  # one coordinator poll on behalf of the queued keys
FETCH_GAP_S = 0.1  # between two such polls: a flood of unknown keys is not a poll storm
NO_COORDINATOR_RETRY_S = 1.0  # nothing to ask: refuse the key this long, then let it ask
# Reports are applied in slices (issue 12): a batch of more rows than the owner applies in
# SLICE_TARGET_NS at its recent pace is applied as sub-batches, one per loop callback, so that
# a batch of the largest legal size (REPORT_ROWS_MAX rows), and a burst of them from one
# sender, holds the loop, and in threaded mode the lock, for about SLICE_TARGET_NS at a time.
# A row costs the owner 1-25 us (opening a new key costs most), so the pace follows the last
# report batch or slice applied: at 2 us a row (known keys) a legal batch is applied whole,
# with one reply; a flood of new keys is cut into slices of SLICE_ROWS_MIN rows or more. The
# first batch of a node, before any pace is known, is cut at REPORT_SLICE_ROWS. The owner
# replies to every slice: at SLICE_ROWS_MIN rows 65,536 rows get 1024 replies, what a peer
# stream's queue holds (mesh.peer's STREAM_QUEUE_MAX; a reply that finds it full is dropped,
# its reports resent).
REPORT_SLICE_ROWS = 128
SLICE_ROWS_MIN = 64
SLICE_TARGET_NS = 500_000
# Rows of one sender's batches waiting for their slices: an honest worker's burst (its
# reports to us over a few sync intervals, at most REPORT_ROWS_MAX a batch) fits many times.
# Past it the sender's next batch is shed (counted in `reports_shed`): its reports are resent
# until acknowledged, so shedding delays, loses nothing.
BACKLOG_ROWS_MAX = 131_072
BACKLOG_SENDERS_MAX = 1024  # senders with a backlog at once; each is a peer stream's member
# A sender's resends (its reports unacknowledged past report_retry_ms, as those waiting here
# are) must not refill its backlog: rows already queued, by (worker_epoch, key, sequence),
# are dropped from a batch on arrival, and a batch left with none is not queued at all
# (`reports_deduplicated`). The set holds the rows queued, so BACKLOG_ROWS_MAX bounds it.
# Memory of refused messages (issue 12): a stream refused for a bad message leaves the message
# in reference cycles (exceptions' tracebacks hold the frames that hold the bytes), and the
# raised GC thresholds of a node (`tune_gc`) collect young objects only after 50,000
# allocations, which an idle node takes long to make: 600 refused 1 MiB messages held 1.2 GB.
# Every REFUSED_CHECK_S a task reads the transport's count of refused streams; when it grew,
# it collects generation 0, lets the loop turn REFUSED_FINALIZE_TURNS times and collects
# generation 1. The first collection runs the garbage's finalizers, and those of the
# streams' unfinished async generators schedule their `aclose()` on the loop, which keeps
# the garbage alive (moved up to generation 1) until it ran; the second frees it there.
# Their cost is bounded by the thresholds (young objects), not by the keys held. A stream
# still finishing during a collection is moved up instead, and may reach the oldest
# generation: once refusals stop for REFUSED_QUIET_S, one full collection frees it, at most
# once per REFUSED_FULL_NS (its cost grows with the keys held: 0.3 s at 125,000 owned keys).
# Then, at most once per REFUSED_TRIM_NS, the freed heap goes back to the OS (`_trim_heap`).
# Hand-over messages queued at once on a graceful leave (`_hand_over`): half a link's queue
# (mesh.peer's LINK_QUEUE_MAX, 1024), so reports queued beside them still fit.
HANDOVER_ROUND = 512
REFUSED_CHECK_S = 0.25
REFUSED_FINALIZE_TURNS = 4
REFUSED_QUIET_S = 1.0
REFUSED_FULL_NS = 30 * NS
REFUSED_TRIM_NS = NS


class NodeDriver:
    def __init__(
        self,
        config: NodeConfig,
        identity: Identity,
        member: Member,
        transport: Transport,
        membership: MembershipSource,
        feed: PolicyFeed | None,
        telemetry: Telemetry,
        *,
        lock: threading.Lock | None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        reloader: PolicyReloader | None = None,
        credit: CreditDriver | None = None,
        redis: Counter | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.member = member
        self.transport = transport
        self.membership = membership
        self.feed = feed
        self.telemetry = telemetry
        self.reloader = reloader  # the local policy file's reloads (None: no policies.file)
        self.credit = credit  # strict limits' calls to governord (None: no `strict:` section)
        self.redis = redis  # redis limits' shared counter (None: no shared_state.redis)
        self.lock = lock or contextlib.nullcontext()
        self.threaded = lock is not None
        self.clock_ns = clock_ns
        self.loop: asyncio.AbstractEventLoop | None = None
        self.membership_view = MembershipView({identity.member_id: ""}, 0, False)
        self.messages_sent = 0
        self.ticks = 0
        self.tick_lag_max_s = 0.0  # the longest the sync tick ran late (loop or CPU busy)
        self.started_ns = clock_ns()
        self.closing = False
        self.handed_over = False  # graceful leave: our keys went to their next owners
        # Graceful leave: keys held, and those not confirmed on the wire within the drain
        # (their next owners start them exhausted, refilling at R: the safe side).
        self.handover_keys = 0
        self.handover_keys_late = 0
        self._flush_soon = False
        self._tasks: list[asyncio.Task[Any]] = []
        self._report_sent: dict[RateKey, tuple[int, int]] = {}  # key -> (sequence, sent ns)
        self._last_snapshot: dict[RateKey, int] = {}
        self.recent_delays_ns: deque[int] = deque(maxlen=DELAYS_KEPT)
        self._report_children: dict[str, Any] = {}
        self._snapshot_children: dict[str, Any] = {}
        for (
            metric
        ) in Metric:  # seed 004's names made now, not among the first keys' (they would pin memory)
            self._histogram(self._report_children, metric, True)
            self._histogram(self._snapshot_children, metric, False)
        self._forget_at_ns = self.started_ns + FORGET_IDLE_NS
        telemetry.top_k = config.telemetry_top_k
        self._refused_logged_ns = -REFUSED_LOG_NS
        self.member.reporter.wake = self._wake
        # Keys the owner asked to fetch (FetchPolicy), in order, each once; the fetcher's
        # event; keys held back after a failed fetch, as (release ns, key), oldest first.
        self._fetch_queue: dict[RateKey, None] = {}
        self._fetch_wake = asyncio.Event()
        self._fetch_held: deque[tuple[int, RateKey]] = deque()
        retry_s = feed.poll_ttl_s if feed is not None else NO_COORDINATOR_RETRY_S
        self._fetch_retry_ns = int(retry_s * NS)
        self.fetch_polls = 0  # coordinator polls made for the owner's unknown keys
        # Report batches waiting to be applied in slices, per sender, served in turn.
        self._backlog: dict[str, _Backlog] = {}
        self._slicing = False  # a slice is scheduled on the loop
        self._slice_rows = REPORT_SLICE_ROWS  # rows in the next slice (SLICE_TARGET_NS)
        self.backlog_rows_max = BACKLOG_ROWS_MAX  # per sender; an attribute for tests
        self.reports_sliced = 0  # batches applied in slices
        self.reports_shed = 0  # batches dropped because their sender's backlog was full
        self.reports_deduplicated = 0  # batches whose every row was queued already
        self.rows_deduplicated = 0  # rows dropped because they were queued already
        self.deliver_hold_max_ns = 0  # the longest one message (or slice) held the Member
        self._refused_seen = 0  # the transport's refused streams, when last looked at
        self._trim_at_ns = self.started_ns  # the next heap trim after refusals, not sooner
        self._trim_owed = False
        self._full_owed = False  # refusals since the last full collection
        self._full_at_ns = self.started_ns  # the next full collection, not sooner
        self._refused_at_ns = 0  # when the refused count last grew
        self.refused_collections = 0  # young collections run because streams were refused
        self.refused_full_collections = 0
        # Spend quotas' shared cell tier (docs/quotas.md; None: owners' folds alone). Cells
        # to write wait here, newest burn per (key, period), for one task that calls the
        # tier off the loop; bounded by the ledger's keys (QUOTA_KEYS_MAX).
        self.cell_tier: CellTier | None = None
        self._tier_pending: dict[tuple[RateKey, int], int] = {}
        self._tier_wake = asyncio.Event()
        self._tier_running = False  # the task that calls the tier, started at first use
        self.tier_errors = 0
        self.tier_folds = 0  # tier answers folded into the ledger
        # Units admitted per limit, counted as reports go out and views settle, never on
        # the hot path (`ratemesh_admitted_units_total`, mesh/node/_units.py)
        self.units = AdmittedUnits()

    @property
    def member_id(self) -> str:
        return self.member.member_id

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.credit is not None:
            self.credit.start()
        self._spawn(self._ticker(), "mesh-tick")
        self._spawn(self._run_membership(), "mesh-membership")
        self._spawn(self._collect_refused(), "mesh-refused-gc")
        if self.reloader is not None and self.reloader.watch_ms > 0:
            self._spawn(self.reloader.watch(), "mesh-policy-file")
        if self.feed is not None:
            await self.feed.poll()  # best effort: start with the coordinator's policies
            self._spawn(self.feed.run(), "mesh-policy-feed")
            self._spawn(self._fetcher(self.feed), "mesh-policy-fetch")

    def _spawn(self, coro: Any, name: str) -> None:
        assert self.loop is not None
        task = self.loop.create_task(coro, name=name)
        task.add_done_callback(_report_crash)
        self._tasks.append(task)

    async def close(self) -> None:
        """Graceful leave: hand our keys to their next owners, leave the ring, flush and
        wait (bounded) for acknowledgements, stop accepting peers, then cancel the rest."""
        if self.closing:
            return
        self.closing = True
        drain_s = self.config.shutdown_drain_ms / 1000
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_s
        await self._hand_over(drain_s / 2)
        try:
            await asyncio.wait_for(self.membership.leave(), max(drain_s, 0.1))
        except TimeoutError:
            log.warning("leaving membership timed out; the lease will lapse instead")
        if self.credit is not None:  # give back what strict limits hold, then end the session
            await _bounded(self.credit.close(), CLOSE_STEP_S * 2, "strict credit")
        self._flush()
        while self._unacked() and loop.time() < deadline:
            await asyncio.sleep(self.config.core.sync_interval_ms / 1000)
        for t in self._tasks:
            t.cancel()
        # Each step is bounded: a stop that hangs on a peer or a membership server that
        # went away would keep the process from ever exiting.
        await _bounded(
            asyncio.gather(*self._tasks, return_exceptions=True), CLOSE_STEP_S, "node tasks"
        )  # their crashes were logged
        self._tasks.clear()
        self._release_fetches(None)  # the fetcher is gone: nothing stays asked for
        await _bounded(self.membership.close(), CLOSE_STEP_S, "membership source")
        if self.feed is not None:
            await _bounded(self.feed.source.close(), CLOSE_STEP_S, "policy source")
        rest_s = max(0.0, deadline - loop.time())
        await _bounded(self.transport.close(rest_s), rest_s + CLOSE_STEP_S, "peer transport")

    async def _hand_over(self, timeout_s: float) -> None:
        """Before leaving the ring: apply our own keys' pending reports, send every held
        key's state to its next owner (issue 4), and wait (bounded) until it is written,
        so the new owners have it before the ring change sends them the keys' reports."""
        self._flush()
        await asyncio.sleep(0)  # reports to ourselves are delivered by the loop: apply them
        while self._backlog:  # and what waits for its slices, so that it is handed over too
            self._next_slice()
        now = self.clock_ns()
        with self.lock:
            effects = self.member.leave(now)
        self.handed_over = True
        # In rounds of HANDOVER_ROUND messages, each written before the next is queued: a
        # hand-over of many keys is many messages (HANDOVER_ROWS_MAX rows each), more than
        # a link's queue holds at once (LINK_QUEUE_MAX; what finds it full is dropped). A
        # round not on the wire by `timeout_s` ends it: what is left is not queued to be
        # dropped, only counted and said (`handover_keys_late`).
        assert self.loop is not None
        until = self.loop.time() + timeout_s
        self.handover_keys = _keys_in(effects)
        for i in range(0, len(effects), HANDOVER_ROUND):
            batch = effects[i : i + HANDOVER_ROUND]
            self._carry(now, batch)
            if not await self.transport.flush(max(0.0, until - self.loop.time())):
                self.handover_keys_late = _keys_in(effects[i:])
                log.warning(
                    "hand-over: %d of %d keys not on the wire within %.0f ms (half of "
                    "shutdown_drain_ms); their next owners start them exhausted",
                    self.handover_keys_late,
                    self.handover_keys,
                    timeout_s * 1000,
                )
                break

    def _unacked(self) -> bool:
        with self.lock:
            return any(v.inflight for v in self.member.reporter.gates.values())

    # -- time -----------------------------------------------------------------------------

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        interval_s = self.config.core.sync_interval_ms / 1000
        next_t = loop.time()
        while True:
            now = self.clock_ns()
            with self.lock:
                self.units.settling(self.member.admission)
                effects = self.member.tick(now)
            self.ticks += 1
            self._carry(now, effects)
            held = self._fetch_held
            if held and held[0][0] <= now:
                self._release_fetches(now)
            if now >= self._forget_at_ns:
                self.forget_idle(now)
            next_t += interval_s
            delay = next_t - loop.time()
            if -delay > self.tick_lag_max_s:
                self.tick_lag_max_s = -delay  # the loop (or the CPU) was this far behind
            if delay < 0:
                next_t = loop.time()
                delay = 0
            await asyncio.sleep(delay)

    def _wake(self) -> None:
        """The reporter's threshold was crossed (on the hot path, maybe another thread)."""
        if self._flush_soon or self.loop is None:
            return
        self._flush_soon = True
        if self.threaded:
            self.loop.call_soon_threadsafe(self._flush)
        else:
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        now = self.clock_ns()
        with self.lock:
            effects = self.member.flush(now)
        self._carry(now, effects)

    def forget_idle(self, now: int) -> None:
        """Drop what idle keys and tenants left in the node's own maps: decision counts
        unchanged since the last call (kept as per-series totals), delay timings older than
        FORGET_IDLE_NS. The core forgets its idle keys itself (views, reporter, owner), but
        the ring's memoised lookups (up to 65,536 keys, each pinning its tenant's name) are
        refilled by whichever side looks a key up after the core compacted: dropped here too,
        so that active keys are looked up again once a period and idle ones are let go."""
        self._forget_at_ns = now + FORGET_IDLE_NS
        with self.lock:
            self.member.ring.forget_lookups()
            self.units.forget_idle()
        dropped = self.telemetry.forget_idle()
        old = now - FORGET_IDLE_NS
        self._report_sent = {k: t for k, t in self._report_sent.items() if t[1] > old}
        self._last_snapshot = {k: t for k, t in self._last_snapshot.items() if t > old}
        if dropped >= TRIM_AFTER:
            _trim_heap()

    async def _collect_refused(self) -> None:
        """Collect what refused streams left in cycles (REFUSED_CHECK_S says how)."""
        while True:
            await asyncio.sleep(REFUSED_CHECK_S)
            now = self.clock_ns()
            refused = self.transport.stats().get("refused_streams", 0)
            if refused != self._refused_seen:
                self._refused_seen = refused
                self._refused_at_ns = now
                await _collect_young()
                self.refused_collections += 1
                self._trim_owed = self._full_owed = True
            elif (
                self._full_owed
                and now - self._refused_at_ns >= REFUSED_QUIET_S * NS
                and now >= self._full_at_ns
            ):
                self._full_owed = False
                self._full_at_ns = now + REFUSED_FULL_NS
                await _collect_young()
                gc.collect()
                for _ in range(REFUSED_FINALIZE_TURNS):
                    await asyncio.sleep(0)
                gc.collect()
                self.refused_full_collections += 1
                self._trim_owed = True
            if self._trim_owed and now >= self._trim_at_ns:
                self._trim_owed = False
                self._trim_at_ns = now + REFUSED_TRIM_NS
                _trim_heap()

    # -- messages -------------------------------------------------------------------------

    def link_reset(self, peer: str) -> None:
        """Our stream to `peer` reopened: resend what it may have lost, at the next tick."""
        with self.lock:
            self.member.reporter.link_reset(peer)

    def deliver(self, message: Message) -> None:
        """A validated message from a peer (the transport's callback). A large report
        batch, and any behind it from the same sender, is applied in slices."""
        if isinstance(message, ReportBatch):
            if len(message.keys) > self._slice_rows or message.sender in self._backlog:
                self._queue_reports(message)
            else:
                self._apply_reports(message)
            return
        self._apply(message)

    def busy(self, sender: str) -> bool:
        """Whether `sender`'s reports wait for their slices: a transport may hold off
        reading its stream (flow control) rather than decode batches that would be shed."""
        backlog = self._backlog.get(sender)
        return backlog is not None and backlog.rows + REPORT_ROWS_MAX > self.backlog_rows_max

    def _queue_reports(self, batch: ReportBatch) -> None:
        """Queue `batch` behind its sender's backlog (order within a sender is kept), or
        shed it if that is full; make sure a slice is scheduled."""
        sender = batch.sender
        backlog = self._backlog.get(sender)
        if backlog is None:
            if len(self._backlog) >= BACKLOG_SENDERS_MAX:
                self.reports_shed += 1
                return
            backlog = self._backlog[sender] = _Backlog()
        elif backlog.queued:
            batch = self._unqueued(backlog, batch)
            if not batch.keys:
                self.reports_deduplicated += 1
                return
        if backlog.rows + len(batch.keys) > self.backlog_rows_max:
            self.reports_shed += 1
            return
        backlog.batches.append(batch)
        backlog.rows += len(batch.keys)
        backlog.queued.update(zip(repeat(batch.worker_epoch), batch.keys, batch.sequences))
        self.reports_sliced += 1
        if not self._slicing:
            self._slicing = True
            assert self.loop is not None
            self.loop.call_soon(self._slice)

    def _unqueued(self, backlog: _Backlog, batch: ReportBatch) -> ReportBatch:
        """`batch` without the rows its sender's backlog holds already (resends)."""
        queued, epoch = backlog.queued, batch.worker_epoch
        keep = [
            i
            for i, (k, s) in enumerate(zip(batch.keys, batch.sequences, strict=True))
            if (epoch, k, s) not in queued
        ]
        if len(keep) == len(batch.keys):
            return batch
        self.rows_deduplicated += len(batch.keys) - len(keep)
        return batch.rows(keep)  # validated already; a subset of its rows, in order

    def _slice(self) -> None:
        """The loop's callback: one slice, then the next one is scheduled, so that the
        loop serves timers and other peers in between."""
        self._slicing = False
        self._next_slice()
        if self._backlog and not self._slicing:
            self._slicing = True
            assert self.loop is not None
            self.loop.call_soon(self._slice)

    def _next_slice(self) -> None:
        """Apply the next slice (`_slice_rows` rows) of the first sender's backlog and send
        that sender to the back (senders take turns). A slice is a batch of its own: the
        same sender, worker_epoch and ring epoch, its rows in order; the owner replies to
        each (sequences are per key, so no report spans two slices)."""
        backlog = self._backlog
        if not backlog:
            return
        sender = next(iter(backlog))
        work = backlog.pop(sender)
        batch, i = work.batches[0], work.offset
        j = i + self._slice_rows
        if j >= len(batch.keys):
            work.batches.popleft()
            work.offset = 0
        else:
            work.offset = j
        part = batch.rows(slice(i, j))  # a batch already decoded and validated, cut
        work.rows -= len(part.keys)
        work.queued.difference_update(zip(repeat(part.worker_epoch), part.keys, part.sequences))
        if work.batches:
            backlog[sender] = work
        self._apply_reports(part)

    def _apply_reports(self, batch: ReportBatch) -> None:
        """Apply a report batch (whole or a slice) and set the next slice's rows to what
        this one's pace applies in SLICE_TARGET_NS, within [SLICE_ROWS_MIN, REPORT_ROWS_MAX]."""
        began = self.clock_ns()
        self._apply(batch)
        took = self.clock_ns() - began
        if took > 0 and batch.keys:
            rows = len(batch.keys) * SLICE_TARGET_NS // took
            self._slice_rows = max(SLICE_ROWS_MIN, min(REPORT_ROWS_MAX, rows))

    def _apply(self, message: Message) -> None:
        now = self.clock_ns()
        owner = self.member.owner
        with self.lock:
            before = owner.refused_n
            effects = self.member.deliver(now, message)
            refused = owner.refused_n - before
        held = self.clock_ns() - now
        if held > self.deliver_hold_max_ns:
            self.deliver_hold_max_ns = held
        if refused:
            self._log_refused(now, message, refused)
        if isinstance(message, SnapshotBatch):
            self._observe(now, message)
        self._carry(now, effects)

    def _log_refused(self, now: int, message: Message, n: int) -> None:
        """The owner refused `n` of a peer's reports (or its hand-over): say who sent them,
        at most once per `REFUSED_LOG_NS` as a warning, so a flood cannot flood the log."""
        level = logging.DEBUG
        if now - self._refused_logged_ns >= REFUSED_LOG_NS:
            self._refused_logged_ns = now
            level = logging.WARNING
        log.log(
            level,
            "refused %d from peer %r (%s); refused so far: %s",
            n,
            message.sender,
            type(message).__name__,
            self.member.owner.refused,
        )

    def report_429(self, tenant: str, metric: str, ms: int) -> None:
        """On the node's loop: the 429 cooldown of (`tenant`, `metric`), here and through its
        owner on every worker that uses the limit (docs/cooldown.md)."""
        now = self.clock_ns()
        with self.lock:
            effects = self.member.report_429(now, tenant, metric, ms)
        self._carry(now, effects)

    def clear_429(self, tenant: str, metric: str) -> bool:
        """On the node's loop: end (`tenant`, `metric`)'s cooldown here (docs/cooldown.md)."""
        with self.lock:
            return self.member.clear_429(tenant, metric)

    def _carry(self, now: int, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Send):
                if isinstance(e.message, ReportBatch):  # ours, going out: count new usage
                    self.units.reported(self.member.reporter.gates, e.message)
                if e.to == self.member_id:  # our own keys: a local call, not a message
                    # Applied whole, not in slices: our own reports come from our own flush
                    # (as long a hold as the flush was), and held in a backlog behind
                    # slices they went unacknowledged past report_retry_ms, were resent,
                    # and their resends filled the backlog (issue 12, `mesh bench churn`).
                    assert self.loop is not None
                    self.loop.call_soon(self._apply, e.message)
                    if isinstance(e.message, CellPublish) and self.cell_tier is not None:
                        self._to_tier(e.message)
                    continue
                if isinstance(e.message, ReportBatch):
                    self._time_reports(now, e.message)
                elif isinstance(e.message, CellPublish) and self.cell_tier is not None:
                    self._to_tier(e.message)
                self.messages_sent += 1
                self.transport.send(e.to, e.message)
            elif isinstance(e, FetchPolicy):
                self._want_policy(now, e.rate_key)
            elif isinstance(e, (ReserveCredit, ReturnCredit)) and self.credit is not None:
                self.credit.carry([e])

    # -- the spend quotas' cell tier --------------------------------------------------------

    def _to_tier(self, msg: CellPublish) -> None:
        for c in msg.cells:
            self._tier_pending[(c.rate_key, c.period_index)] = c.burn
        if not self._tier_running and self.member.quotas is not None and not self.closing:
            self._tier_running = True  # one task for the node's life: set cell_tier any time
            self._spawn(self._run_tier(), "mesh-cell-tier")
        self._tier_wake.set()

    async def _run_tier(self) -> None:
        """Write the pending cells to the tier, one blocking call at a time in a thread,
        and fold each answer into the ledger (remote = max(owner fold, tier fold))."""
        tier, quotas = self.cell_tier, self.member.quotas
        assert tier is not None and quotas is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._tier_wake.wait()
            self._tier_wake.clear()
            while self._tier_pending:
                (key, index), burn = self._tier_pending.popitem()
                now_ms = quotas.wall_ms()
                try:
                    cells = await loop.run_in_executor(
                        None, tier.exchange, now_ms, key, index, self.member_id, burn
                    )
                except Exception as exc:  # noqa: BLE001 - the tier is best effort beside the owners
                    self.tier_errors += 1
                    log.debug("cell tier: %s", exc)
                    continue
                with self.lock:
                    quotas.ledger.tier_folded(quotas.wall_ms(), key, index, cells)
                self.tier_folds += 1

    # -- policy fetches -------------------------------------------------------------------

    def _want_policy(self, now: int, key: RateKey) -> None:
        """The owner lacks `key`'s generation: queue it for the fetcher (once), or hold it
        back for a retry delay when there is no coordinator to ask or the node is closing.
        A key that fits nowhere is answered at once: the owner may ask again later."""
        queue = self._fetch_queue
        if key in queue:
            return  # coalesced: the queued fetch answers this one too
        if self.feed is not None and not self.closing and len(queue) < FETCH_QUEUE_MAX:
            queue[key] = None
            self._fetch_wake.set()
        elif len(self._fetch_held) < FETCH_QUEUE_MAX:
            self._fetch_held.append((now + self._fetch_retry_ns, key))
        else:
            self._learned([key])

    async def _fetcher(self, feed: PolicyFeed) -> None:
        """The one fetch task: answer every queued key with one coordinator poll (bounded
        by FETCH_TIMEOUT_S, at most one per FETCH_GAP_S). Whatever the outcome (learned,
        unknown, failed, timed out, cancelled) every key taken is answered: learned ones at
        once, the rest after the retry delay (`_release_fetches`)."""
        queue = self._fetch_queue
        while True:
            await self._fetch_wake.wait()
            self._fetch_wake.clear()
            while queue:
                keys = list(queue)  # arriving meanwhile: left queued, for the next poll
                try:
                    if any(self.member.policies.get(k) is None for k in keys):
                        self.fetch_polls += 1
                        await asyncio.wait_for(feed.poll(), FETCH_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001 - any failure is "still unknown"
                    log.warning("policy fetch for %d keys failed: %r", len(keys), exc)
                finally:
                    self._answer_fetched(keys)
                await asyncio.sleep(FETCH_GAP_S)

    def _answer_fetched(self, keys: list[RateKey]) -> None:
        """A poll on behalf of `keys` ended: those now known may be asked for again at
        once; the rest are held back for the retry delay."""
        now = self.clock_ns()
        policies, held = self.member.policies, self._fetch_held
        known: list[RateKey] = []
        for key in keys:
            self._fetch_queue.pop(key, None)
            if policies.get(key) is not None or len(held) >= FETCH_QUEUE_MAX:
                known.append(key)
            else:
                held.append((now + self._fetch_retry_ns, key))
        self._learned(known)

    def _release_fetches(self, now: int | None) -> None:
        """Answer the held keys whose retry delay ran out (all of them, and the queued
        ones too, with `now` None: the node is closing)."""
        held = self._fetch_held
        keys: list[RateKey] = []
        while held and (now is None or held[0][0] <= now):
            keys.append(held.popleft()[1])
        if now is None:
            keys.extend(self._fetch_queue)
            self._fetch_queue.clear()
        self._learned(keys)

    def _learned(self, keys: list[RateKey]) -> None:
        if keys:
            with self.lock:
                for key in keys:
                    self.member.owner.policy_learned(key)

    def _time_reports(self, now: int, batch: ReportBatch) -> None:
        sent = self._report_sent
        if len(sent) >= DELAY_TRACK_MAX:
            sent.clear()
        for key, seq in zip(batch.keys, batch.sequences, strict=True):
            if key not in sent:
                sent[key] = (seq, now)

    def _observe(self, now: int, batch: SnapshotBatch) -> None:
        """Report delay (send to acknowledgement) and snapshot delay (age of the view
        when the next snapshot lands), per metric; prometheus children are cached."""
        sent, last = self._report_sent, self._last_snapshot
        if len(last) >= DELAY_TRACK_MAX:
            last.clear()
        for key, ack in zip(batch.keys, batch.acks, strict=True):
            t = sent.get(key)
            if t is not None and ack >= t[0]:
                del sent[key]
                self.recent_delays_ns.append(now - t[1])
                self._histogram(self._report_children, key.metric, True).observe((now - t[1]) / NS)
            prev = last.get(key)
            if prev is not None:
                self._histogram(self._snapshot_children, key.metric, False).observe(
                    (now - prev) / NS
                )
            last[key] = now

    def _histogram(self, cache: dict[str, Any], metric: str, report: bool) -> Any:
        child = cache.get(metric)
        if child is None:
            h = self.telemetry.report_delay if report else self.telemetry.snapshot_delay
            child = cache[metric] = h.labels(metric)
        return child

    # -- membership -----------------------------------------------------------------------

    async def _run_membership(self) -> None:
        await self.membership.run(self.on_membership)

    def on_membership(self, view: MembershipView) -> None:
        """Adopt the source's view: a new ring if the members or epoch changed, else only
        the stale flag (share limits decay to N=1 while stale, and say so)."""
        if self.closing and (not view.members or self.handed_over):
            return  # we route by the ring without us until we stop
        members = dict(view.members) or {self.member_id: ""}
        now = self.clock_ns()
        ring = self.member.ring
        self.membership_view = view
        with self.lock:
            if set(members) == set(ring.members) and view.epoch <= ring.epoch:
                self.member.admission.membership(len(ring), view.stale, now)
                return
            epoch = view.epoch if view.epoch > ring.epoch else ring.epoch + 1
            new = Ring(members, epoch, vnodes=ring.vnodes)
            self.member.ring_changed(now, new, stale=view.stale)
        self.transport.set_peers({m: a for m, a in members.items() if m != self.member_id})
        log.info(
            "ring epoch %d: %s%s", epoch, ",".join(new.members), " (stale)" if view.stale else ""
        )


async def _collect_young() -> None:
    """Collect generations 0 and 1, letting the loop run the finalizers' `aclose()`s
    in between (REFUSED_CHECK_S says why)."""
    gc.collect(0)
    for _ in range(REFUSED_FINALIZE_TURNS):
        await asyncio.sleep(0)
    gc.collect(1)
    for _ in range(REFUSED_FINALIZE_TURNS):
        await asyncio.sleep(0)


class _Backlog:
    """One sender's report batches waiting for their slices; `offset`: the next row of
    the first; `rows`: the rows not yet applied; `queued`: those rows, by (worker_epoch,
    key, sequence), so that a resend of one is not queued twice."""

    __slots__ = ("batches", "offset", "rows", "queued")

    def __init__(self) -> None:
        self.batches: deque[ReportBatch] = deque()
        self.offset = 0
        self.rows = 0
        self.queued: set[tuple[int, RateKey, int]] = set()


def _trim_heap() -> None:
    """Return the C heap's free pages to the OS (glibc's malloc_trim): after many tenants
    went idle their memory is free but the allocator keeps it (issue 12). Elsewhere, nothing."""
    try:
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # this process's symbols
    except OSError:
        return
    if trim is not None:
        trim(0)


def _keys_in(effects: list[Effect]) -> int:
    """The keys a graceful leave's hand-over messages carry."""
    return sum(
        len(e.message.keys)
        for e in effects
        if isinstance(e, Send) and isinstance(e.message, Handover)
    )


def _report_crash(task: asyncio.Task[Any]) -> None:
    """A node task ended other than by cancellation: that is a bug; say so loudly."""
    if not task.cancelled() and task.exception() is not None:
        log.error("node task %s crashed", task.get_name(), exc_info=task.exception())


async def _bounded(step: Awaitable[Any], timeout_s: float, what: str) -> None:
    """Await one step of closing for at most `timeout_s`; past that, say so and go on."""
    try:
        await asyncio.wait_for(step, timeout_s)
    except TimeoutError:
        log.warning("closing: %s did not stop within %.1f s; going on without it", what, timeout_s)

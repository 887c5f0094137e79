"""What peers send us, into the Member: report batches applied whole or in slices, the
rest (snapshots, hand-overs, cells, cooldowns) whole, and the owner's refusals logged.

Reports are applied in slices: a batch of more rows than the owner applies in
SLICE_TARGET_NS at its recent pace is applied as sub-batches, one per loop callback, so that
a batch of the largest legal size (REPORT_ROWS_MAX rows), and a burst of them from one
sender, holds the loop, and in threaded mode the lock, for about SLICE_TARGET_NS at a time.
A row costs the owner 1-25 us (opening a new key costs most), so the pace follows the last
report batch or slice applied: at 2 us a row (known keys) a legal batch is applied whole,
with one reply; a flood of new keys is cut into slices of SLICE_ROWS_MIN rows or more. The
first batch of a node, before any pace is known, is cut at REPORT_SLICE_ROWS. The owner
replies to every slice: at SLICE_ROWS_MIN rows 65,536 rows get 1024 replies, what a peer
stream's queue holds (mesh.peer's STREAM_QUEUE_MAX; a reply that finds it full is dropped,
its reports resent).

Rows of one sender's batches waiting for their slices are bounded by BACKLOG_ROWS_MAX: an
honest worker's burst (its reports to us over a few sync intervals, at most REPORT_ROWS_MAX
a batch) fits many times. Past it the sender's next batch is shed (`reports_shed`): its
reports are resent until acknowledged, so shedding delays, loses nothing. A sender's
resends (its reports unacknowledged past report_retry_ms, as those waiting here are) must
not refill its backlog: rows already queued, by (worker_epoch, key, sequence), are dropped
from a batch on arrival, and a batch left with none is not queued at all
(`reports_deduplicated`). The set holds the rows queued, so BACKLOG_ROWS_MAX bounds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from itertools import repeat
from typing import Any

from mesh.core.effects import Effect
from mesh.core.member import Member
from mesh.core.messages import REPORT_ROWS_MAX, Message, ReportBatch, SnapshotBatch
from mesh.core.policy import RateKey

__all__ = [
    "Ingest",
    "BACKLOG_ROWS_MAX",
    "BACKLOG_SENDERS_MAX",
    "REPORT_SLICE_ROWS",
    "SLICE_ROWS_MIN",
    "SLICE_TARGET_NS",
]

log = logging.getLogger("mesh.node")
NS = 1_000_000_000
REFUSED_LOG_NS = NS  # peers' refused reports: one warning per this long, the rest at debug
REPORT_SLICE_ROWS = 128
SLICE_ROWS_MIN = 64
SLICE_TARGET_NS = 500_000
BACKLOG_ROWS_MAX = 131_072
BACKLOG_SENDERS_MAX = 1024  # senders with a backlog at once; each is a peer stream's member


class Ingest:
    """Applies peers' messages to the Member under the node's lock, and carries out the
    effects with `carry`; a snapshot batch is shown to `observe` (the delay timings)."""

    def __init__(
        self,
        member: Member,
        lock: AbstractContextManager[Any],
        clock_ns: Callable[[], int],
        carry: Callable[[int, list[Effect]], None],
        observe: Callable[[int, SnapshotBatch], None],
    ) -> None:
        self.member = member
        self.lock = lock
        self.clock_ns = clock_ns
        self.carry = carry
        self.observe = observe
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the node's start
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
        self._refused_logged_ns = -REFUSED_LOG_NS

    def deliver(self, message: Message) -> None:
        """A validated message from a peer (the transport's callback). A large report
        batch, and any behind it from the same sender, is applied in slices."""
        if isinstance(message, ReportBatch):
            if len(message.keys) > self._slice_rows or message.sender in self._backlog:
                self._queue_reports(message)
            else:
                self._apply_reports(message)
            return
        self.apply(message)

    def busy(self, sender: str) -> bool:
        """Whether `sender`'s reports wait for their slices: a transport may hold off
        reading its stream (flow control) rather than decode batches that would be shed."""
        backlog = self._backlog.get(sender)
        return backlog is not None and backlog.rows + REPORT_ROWS_MAX > self.backlog_rows_max

    def drain(self) -> None:
        """Apply every backlog now (a graceful leave hands over what they change)."""
        while self._backlog:
            self._next_slice()

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
        self.apply(batch)
        took = self.clock_ns() - began
        if took > 0 and batch.keys:
            rows = len(batch.keys) * SLICE_TARGET_NS // took
            self._slice_rows = max(SLICE_ROWS_MIN, min(REPORT_ROWS_MAX, rows))

    def apply(self, message: Message) -> None:
        """Apply one message whole (a report batch too: the node's own come here)."""
        now = self.clock_ns()
        owner = self.member.owner
        slots = self.member.slots.owner  # in-flight caps' owner refuses implausible reports too
        with self.lock:
            before, slots_before = owner.refused_n, slots.refused
            effects = self.member.deliver(now, message)
            refused = owner.refused_n - before + slots.refused - slots_before
        held = self.clock_ns() - now
        if held > self.deliver_hold_max_ns:
            self.deliver_hold_max_ns = held
        if refused:
            self._log_refused(now, message, refused)
        if isinstance(message, SnapshotBatch):
            self.observe(now, message)
        self.carry(now, effects)

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

"""The durable record: group commit over a backend, and a loader that refuses a bad record.

Write before reply, in three steps:
1. under the engine's lock, ``append(event)`` only adds the event to a pending list (no I/O);
2. one writer thread takes everything pending and commits it as one transaction, so the batch
   grows by itself with load;
3. the caller's reply waits in ``wait(seq)`` until its sequence number is committed.

Events are numbered under one lock and written in that order, so the record is always a prefix
of what happened. A failed commit leaves memory ahead of the record; the log then calls
``on_fatal`` (default: exit the process with status 70) and never rolls memory back.

A leader on a shared database (``fence``) also commits an empty batch every ``renew_every_s``
when idle (each commit renews its leader row), answers ``want_round``: a commit round that
starts after the ask proves the epoch is still this process's (``Validate`` waits for one), and
calls ``on_fatal`` when one round has been in the database for longer than the lease: past that
a standby may have taken over, so the process stops instead of waiting on a partition.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from governor.engine import (
    Event,
    LogGap,
    SnapshotMismatch,
    UnknownEventKind,
    decode_event,
    encode_event,
)
from governor.engine import _events as ev

from ._backend import Backend, Batch
from ._errors import CommitFailed, Deposed

__all__ = ["EventLog", "Loaded", "exit_process"]

EXIT_COMMIT_FAILED = 70


def exit_process(exc: BaseException) -> None:
    """The default reaction to a failed commit: say why, then stop at once."""
    print(
        f"governord: commit failed, stopping so a supervisor restarts from the record: {exc}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_COMMIT_FAILED)


@dataclass(frozen=True, slots=True)
class Loaded:
    snapshot: dict[str, Any] | None
    events: list[Event]

    @property
    def snapshot_seq(self) -> int:
        return int(self.snapshot["seq"]) if self.snapshot else 0

    @property
    def last_seq(self) -> int:
        if self.events:
            return self.events[-1].seq
        return self.snapshot_seq


class EventLog:
    def __init__(
        self,
        backend: Backend,
        *,
        on_fatal: Callable[[BaseException], None] = exit_process,
    ) -> None:
        self.backend = backend
        self._on_fatal = on_fatal
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the writer waits here for pending work
        self._done = threading.Condition(self._lock)  # callers wait here for their commit
        self._pending: list[Event] = []
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        self._committed = 0
        self._appended = 0
        self._failed: BaseException | None = None
        self._closing = False
        self._writer: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._renew_every_s: float | None = None
        self._lease_s: float | None = None
        self._round = 0  # commit rounds started; a round after ``want_round`` confirms the epoch
        self._rounds_done = 0
        self._round_wanted = False
        self._round_started_at: float | None = None  # monotonic start of the round in flight
        self.batches = 0
        # Called by the writer after each commit, outside the lock: (committed seq, events in
        # the batch, seconds the commit took). The async server resolves its waits here.
        self.commit_listeners: list[Callable[[int, int, float], None]] = []
        # Called by the writer after each round (the round's number), outside the lock.
        self.round_listeners: list[Callable[[int], None]] = []
        self.backend.migrate()

    # ---- loading ---------------------------------------------------------------------------

    def load(self, prior: Loaded | None = None) -> Loaded:
        """Read and check the record: a gap, an unknown kind or a misfit snapshot refuses.

        ``prior``: what an earlier load read (a standby tailing the log); only the events after
        it are read, unless a newer snapshot has replaced the one it started from."""
        if prior is not None and hasattr(self.backend, "read_after"):
            rows = self.backend.read_after(prior.snapshot_seq, prior.last_seq)
            if rows is not None:
                prior.events.extend(_decode(rows.events, prior.last_seq + 1))  # no copy
                loaded = prior
                self._committed = self._appended = loaded.last_seq
                return loaded
        rows = self.backend.read()
        snapshot = None
        start = 1
        if rows.snapshot is not None:
            seq, text = rows.snapshot
            try:
                snapshot = json.loads(text)
            except ValueError as exc:
                raise SnapshotMismatch(f"snapshot at seq {seq} is not JSON") from exc
            if not isinstance(snapshot, dict) or snapshot.get("seq") != seq:
                raise SnapshotMismatch(f"snapshot row says seq {seq}, its state says otherwise")
            start = seq + 1
        if rows.events and rows.events[0][0] < start:
            raise SnapshotMismatch(
                f"event {rows.events[0][0]} is covered by the snapshot at {start - 1} but was not "
                "deleted"
            )
        loaded = Loaded(snapshot, _decode(rows.events, start))
        self._committed = self._appended = loaded.last_seq
        return loaded

    # ---- leadership (a shared database) ------------------------------------------------------

    def fence(self, *, renew_every_s: float, lease_s: float) -> None:
        """This process leads: renew when idle, and stop if a round outlives the lease."""
        self._renew_every_s = renew_every_s
        self._lease_s = lease_s

    def want_round(self) -> int:
        """The round whose completion proves this process still leads (0: nothing to prove)."""
        if self._lease_s is None:
            return 0
        with self._lock:
            self._round_wanted = True
            self._work.notify()
            return self._round + 1

    @property
    def rounds_done(self) -> int:
        return self._rounds_done

    # ---- the hot path (under the engine lock: no I/O) ---------------------------------------

    def append(self, event: Event) -> None:
        with self._lock:
            self._pending.append(event)
            self._appended = event.seq
            self._work.notify()

    def append_snapshot(self, seq: int, state: dict[str, Any]) -> None:
        """Save ``state`` taken at ``seq``, deleting the events it covers, in one commit."""
        with self._lock:
            self._snapshot = (seq, state)
            self._work.notify()

    def wait(self, seq: int, timeout_s: float | None = None) -> None:
        """Block until every event up to ``seq`` is durable."""
        if self._committed >= seq:  # already durable: no need to take the lock
            return
        with self._lock:
            ok = self._done.wait_for(
                lambda: self._committed >= seq or self._failed is not None, timeout_s
            )
            if self._failed is not None:
                raise CommitFailed("the record is behind memory") from self._failed
            if not ok:
                raise TimeoutError(f"seq {seq} not committed within {timeout_s} s")

    @property
    def committed_seq(self) -> int:
        return self._committed

    # ---- the writer ------------------------------------------------------------------------

    def start(self) -> None:
        self._writer = threading.Thread(target=self._run, name="governor-writer", daemon=True)
        self._writer.start()
        if self._lease_s is not None:
            self._watchdog = threading.Thread(
                target=self._watch, name="governor-watchdog", daemon=True
            )
            self._watchdog.start()

    def _watch(self) -> None:
        """A round in the database for longer than the lease: this process may be deposed."""
        assert self._lease_s is not None
        lease_s = self._lease_s
        while not self._closing and self._failed is None:
            time.sleep(min(0.05, lease_s / 10))
            started = self._round_started_at
            if started is not None and time.monotonic() - started > lease_s:
                exc = Deposed(
                    f"a commit has waited on the database for more than the {lease_s * 1000:.0f}"
                    " ms leader lease; a standby may lead now"
                )
                with self._lock:
                    self._failed = exc
                    self._done.notify_all()
                self._on_fatal(exc)
                return

    def close(self) -> None:
        """Commit what is pending, stop the writer, close the database."""
        with self._lock:
            self._closing = True
            self._work.notify()
        if self._writer is not None:
            self._writer.join()
        self.backend.close()

    def _has_work(self) -> bool:
        return bool(self._pending) or self._snapshot is not None or self._round_wanted

    def _run(self) -> None:
        while True:
            with self._lock:
                got = self._work.wait_for(
                    lambda: self._has_work() or self._closing, self._renew_every_s
                )
                if self._closing and not self._has_work():
                    return
                renewing = not got  # idle past the renew interval: an empty round renews
                if not (self._has_work() or renewing):
                    continue
                events, self._pending = self._pending, []
                snapshot, self._snapshot = self._snapshot, None
                self._round += 1
                this_round = self._round
                self._round_wanted = False
                self._round_started_at = time.monotonic()
            started = time.perf_counter()
            try:
                self.backend.commit(self._batch(events, snapshot))
            except BaseException as exc:  # noqa: BLE001 - any failure stops the process
                with self._lock:
                    self._failed = exc
                    self._done.notify_all()
                self._on_fatal(exc)
                return
            with self._lock:
                self._round_started_at = None
                self._rounds_done = this_round
                if events:
                    self._committed = events[-1].seq
                self.batches += 1
                self._done.notify_all()
                committed = self._committed
            took = time.perf_counter() - started
            if events or snapshot is not None:
                for listener in self.commit_listeners:
                    listener(committed, len(events), took)
            for on_round in self.round_listeners:
                on_round(this_round)

    @staticmethod
    def _batch(events: list[Event], snapshot: tuple[int, dict[str, Any]] | None) -> Batch:
        rows = []
        tokens: list[tuple[str, int]] = []
        ended: list[int] = []
        for event in events:
            kind, data = encode_event(event)
            rows.append((event.seq, kind, json.dumps(data, separators=(",", ":"))))
            if isinstance(event, ev.SessionOpened):
                tokens.append((event.token_sha256, event.session_id))
            elif isinstance(event, (ev.SessionClosed, ev.SessionExpired)):
                ended.append(event.session_id)
        snap = None
        if snapshot is not None:
            snap = (snapshot[0], json.dumps(snapshot[1], separators=(",", ":")))
        return Batch(rows, tokens, ended, snap)


def _decode(rows: list[tuple[int, str, str]], start: int) -> list[Event]:
    """Event rows from ``start`` on, checked: contiguous, known kinds, their own seq."""
    events: list[Event] = []
    for i, (seq, kind, payload) in enumerate(rows):
        expected = start + i
        if seq != expected:
            raise LogGap(f"event log has a gap: expected seq {expected}, found {seq}")
        try:
            data = json.loads(payload)
        except ValueError as exc:
            raise UnknownEventKind(f"event {seq} payload is not JSON") from exc
        event = decode_event(kind, data)
        if event.seq != seq:
            raise LogGap(f"event row {seq} carries seq {event.seq}")
        events.append(event)
    return events

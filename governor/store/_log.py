"""The durable record: group commit over a backend, and a loader that refuses a bad record.

Write before reply, in three steps:
1. under the engine's lock, ``append(event)`` only adds the event to a pending list (no I/O);
2. one writer thread takes everything pending and commits it as one transaction, so the batch
   grows by itself with load;
3. the caller's reply waits in ``wait(seq)`` until its sequence number is committed.

Events are numbered under one lock and written in that order, so the record is always a prefix
of what happened. A failed commit leaves memory ahead of the record; the log then calls
``on_fatal`` (default: exit the process with status 70) and never rolls memory back.
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
from ._errors import CommitFailed

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
    def last_seq(self) -> int:
        if self.events:
            return self.events[-1].seq
        return int(self.snapshot["seq"]) if self.snapshot else 0


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
        self.batches = 0
        # Called by the writer after each commit, outside the lock: (committed seq, events in
        # the batch, seconds the commit took). The async server resolves its waits here.
        self.commit_listeners: list[Callable[[int, int, float], None]] = []
        self.backend.migrate()

    # ---- loading ---------------------------------------------------------------------------

    def load(self) -> Loaded:
        """Read and check the record: a gap, an unknown kind or a misfit snapshot refuses."""
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
        events: list[Event] = []
        for i, (seq, kind, payload) in enumerate(rows.events):
            expected = start + i
            if seq != expected:
                if i == 0 and seq < start:
                    raise SnapshotMismatch(
                        f"event {seq} is covered by the snapshot at {start - 1} but was not deleted"
                    )
                raise LogGap(f"event log has a gap: expected seq {expected}, found {seq}")
            try:
                data = json.loads(payload)
            except ValueError as exc:
                raise UnknownEventKind(f"event {seq} payload is not JSON") from exc
            event = decode_event(kind, data)
            if event.seq != seq:
                raise LogGap(f"event row {seq} carries seq {event.seq}")
            events.append(event)
        loaded = Loaded(snapshot, events)
        self._committed = self._appended = loaded.last_seq
        return loaded

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

    def close(self) -> None:
        """Commit what is pending, stop the writer, close the database."""
        with self._lock:
            self._closing = True
            self._work.notify()
        if self._writer is not None:
            self._writer.join()
        self.backend.close()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._work.wait_for(
                    lambda: self._pending or self._snapshot is not None or self._closing
                )
                if not self._pending and self._snapshot is None:
                    return
                events, self._pending = self._pending, []
                snapshot, self._snapshot = self._snapshot, None
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
                if events:
                    self._committed = events[-1].seq
                self.batches += 1
                self._done.notify_all()
                committed = self._committed
            took = time.perf_counter() - started
            for listener in self.commit_listeners:
                listener(committed, len(events), took)

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

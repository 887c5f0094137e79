"""The driver of the engine: one lock around every call, and no reply before its record.

Each call runs under the lock (check, apply in memory, events numbered and appended to the
pending list), then waits outside the lock until the log has committed everything up to the
engine's last sequence number, including events of other callers this answer may depend on.
Memory may run ahead of the record; a caller never does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

from governor.engine import (
    Denial,
    Engine,
    EngineConfig,
    Event,
    GovernorError,
    Granted,
    Queued,
)
from governor.engine import _events as ev
from governor.store import EventLog, Loaded

__all__ = ["Authority", "Step", "WallClock"]

T = TypeVar("T")
# Events after which a queued acquire may have an outcome (a grant, or a denial because its
# session or node ended).
_ENDS_WAITS = (ev.SessionClosed, ev.SessionExpired, ev.NodeEnded)


class Step(NamedTuple):
    result: Any
    error: GovernorError | None
    seq: int  # reply once this is committed
    wrote: bool  # the step recorded events (its commit proves the epoch)


class WallClock:
    """Milliseconds since the epoch: deadlines and expiries are stored as absolute times."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class Authority:
    def __init__(
        self,
        log: EventLog,
        *,
        clock: Any = None,
        config: EngineConfig | None = None,
        snapshot_every: int = 10_000,
        loaded: Loaded | None = None,
    ) -> None:
        """``loaded``: the record as a standby already read it (``log.load``); else read now."""
        self.log = log
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a queued acquire may have an outcome
        self._since_snapshot = 0
        self._snapshot_every = snapshot_every
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        # Called under the lock (keep them cheap, no I/O): every event, and a change after which
        # a queued acquire may have an outcome. The server uses them for metrics and async waits.
        self.event_listeners: list[Callable[[Event], None]] = []
        self.change_listeners: list[Callable[[], None]] = []
        if loaded is None:
            loaded = log.load()
        with self._lock:
            self.engine = Engine.restore(
                loaded.snapshot,
                loaded.events,
                clock or WallClock(),
                self._on_event,
                config,
            )
        log.start()
        self.log.wait(self.engine.last_seq)

    def _on_event(self, event: Event) -> None:
        """The engine's sink, called under the lock: append only, no I/O."""
        self.log.append(event)
        self._since_snapshot += 1
        for listener in self.event_listeners:
            listener(event)
        if (isinstance(event, ev.LeaseGranted) and event.waiter_id is not None) or isinstance(
            event, _ENDS_WAITS
        ):
            self._changed.notify_all()
            for notify in self.change_listeners:
                notify()

    def _seq_to_wait_for(self) -> int:
        """Under the lock: the sequence a reply must wait for; take a snapshot when due."""
        seq = self.engine.last_seq
        if self._since_snapshot >= self._snapshot_every:
            self.log.append_snapshot(seq, self.engine.snapshot())
            self._since_snapshot = 0
        return seq

    def step(self, fn: Callable[[Engine], T]) -> Step:
        """Run ``fn(engine)`` as one atomic step without waiting for the record.

        Returns ``(result, error, seq, wrote)``: the caller must not reply before ``seq`` is
        committed (the async server awaits it instead of blocking a thread in ``log.wait``).
        ``wrote`` is False when the step recorded nothing (a read, a denial, a resend): on a
        shared database its answer is a read, which the server confirms before replying.
        """
        error: GovernorError | None = None
        result: T | None = None
        with self._lock:
            before = self.engine.last_seq
            try:
                result = fn(self.engine)
            except GovernorError as exc:
                error = exc
            wrote = self.engine.last_seq != before
            seq = self._seq_to_wait_for()
        return Step(result, error, seq, wrote)

    def read(self, fn: Callable[[Engine], T]) -> T:
        """Run a read-only ``fn(engine)`` under the lock (metrics, watches); no record to wait."""
        with self._lock:
            return fn(self.engine)

    def call(self, fn: Callable[[Engine], T]) -> T:
        """Run ``fn(engine)`` as one atomic step and return once its record is durable.

        A caller error is raised only after the record has caught up too: the call may have
        brought time up to date first (an expiry, say), and its answer can depend on that.
        """
        result, error, seq, _ = self.step(fn)
        self.log.wait(seq)
        if error is not None:
            raise error
        return cast(T, result)

    def acquire(
        self,
        session_id: int,
        node_id: int,
        cls: str,
        *,
        timeout_s: float | None = None,
        request_id: str | None = None,
    ) -> Granted | Denial | None:
        """Acquire a lease, waiting in the fair queue up to ``timeout_s``; None if it gave up.

        A grant that races with giving up is released at once and re-dispatched
        (``cancel_wait``), so no lease leaks either way.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        error: GovernorError | None = None
        result: Granted | Queued | Denial | None = None
        with self._lock:
            try:
                result = self.engine.acquire(session_id, node_id, cls, request_id=request_id)
                while isinstance(result, Queued):
                    outcome = self.engine.take_outcome(session_id, result.waiter_id)
                    if outcome is not None:
                        result = outcome
                        break
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        self.engine.cancel_wait(session_id, result.waiter_id)
                        result = None
                        break
                    self._changed.wait(remaining)
            except GovernorError as exc:
                error = exc
            seq = self._seq_to_wait_for()
        self.log.wait(seq)
        if error is not None:
            raise error
        assert not isinstance(result, Queued)
        return result

    def snapshot_now(self) -> int:
        with self._lock:
            seq = self.engine.last_seq
            self.log.append_snapshot(seq, self.engine.snapshot())
            self._since_snapshot = 0
        self.log.wait(seq)
        return seq

    def start_reaper(self, interval_s: float = 0.1) -> None:
        """Tick the engine every interval (expiry is lazy too: this only adds promptness)."""

        def loop() -> None:
            while not self._stop.wait(interval_s):
                self.call(lambda e: e.tick())

        self._reaper = threading.Thread(target=loop, name="governor-reaper", daemon=True)
        self._reaper.start()

    def close(self) -> None:
        """Stop the reaper, commit what is pending, close the database."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join()
        self.log.close()

"""The engine: decides, emits events, and applies them; no I/O, no threads, no wall clock.

Every public method is one atomic step: the driver holds one lock around it (governor.authority),
so the whole-chain check and the charge that follows see the same state. Each step first brings
time-driven work up to date (session expiry, deadlines, AIMD, purges): expiry is checked lazily on
every touch, and ``tick()`` is the reaper a driver calls on a timer.

Not recorded as events, on purpose: heartbeats (a restart gives every open session one fresh TTL),
waiting acquires (a restart fails those calls; callers retry), and purges of tombstones and ended
nodes (a pure function of time, redone on restore).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import _events as ev
from ._core import Core, EventSink
from ._credit import Credit
from ._edits import COOLDOWN_MS_MAX, COOLDOWNS_PER_NODE_MAX, Edits
from ._errors import LogGap, RecordError, SnapshotMismatch
from ._fairq import Waiter
from ._housekeeping import Housekeeping
from ._leasebook import LeaseBook
from ._leasing import Leasing
from ._policies import Policies
from ._sessions import Sessions
from ._snapshot import dump_state, load_state
from ._state import Node, State
from ._tree import Tree
from ._types import Clock, EngineConfig, SessionState

__all__ = ["COOLDOWNS_PER_NODE_MAX", "COOLDOWN_MS_MAX", "Engine"]


class Engine:
    """The tree of caps and leases, the fair queue and the adaptive limits, behind one lock.

    A facade over books that share one ``Core`` (state, clock, sink, timers), each taking the
    others it needs: the lease book (grants, the fair queue, endings) under the housekeeping
    (``advance``, every call's first step, which ends what has expired) under the books of
    calls (sessions, tree, edits, leasing, credit, policies). The engine's calls are the
    books' own methods, bound here, so the facade costs the hot path nothing.
    """

    def __init__(
        self,
        clock: Clock,
        sink: EventSink,
        config: EngineConfig | None = None,
        *,
        _state: State | None = None,
    ) -> None:
        self.config = config = config or EngineConfig()
        self._core = core = Core(config, clock, sink, _state or State(config))
        self._leases = leases = LeaseBook(core)
        self._clock = housekeeping = Housekeeping(core, leases)
        self._credit = credit = Credit(core, housekeeping)
        sessions = Sessions(core, housekeeping, leases)
        tree = Tree(core, housekeeping, leases)
        edits = Edits(core, housekeeping, leases)
        leasing = Leasing(core, housekeeping, leases)
        policies = Policies(core, housekeeping)

        self.tick = housekeeping.tick
        self.open_session = sessions.open_session
        self.heartbeat = sessions.heartbeat
        self.close_session = sessions.close_session
        self.session_for_token = sessions.session_for_token
        self.session_for_key = sessions.session_for_key
        self.create_node = tree.create_node
        self.consume = tree.consume
        self.end_node = tree.end_node
        self.effective_deadline_ms = tree.effective_deadline_ms
        self.set_quota = edits.set_quota
        self.set_limit = edits.set_limit
        self.set_rate = edits.set_rate
        self.set_defaults = edits.set_defaults
        self.set_weight = edits.set_weight
        self.set_deadline = edits.set_deadline
        self.set_cooldown = edits.set_cooldown
        self.set_adaptive = edits.set_adaptive
        self.acquire = leasing.acquire
        self.take_outcome = leasing.take_outcome
        self.cancel_wait = leasing.cancel_wait
        self.release = leasing.release
        self.validate = leasing.validate
        self.reserve_credit = credit.reserve_credit
        self.return_credit = credit.return_credit
        self.credit_level = credit.credit_level
        self.put_policy = policies.put_policy
        self.remove_policy = policies.remove_policy

    # ---- restore and snapshot ------------------------------------------------------------

    @classmethod
    def restore(
        cls,
        snapshot: dict[str, Any] | None,
        events: Iterable[ev.Event],
        clock: Clock,
        sink: EventSink,
        config: EngineConfig | None = None,
    ) -> Engine:
        """Rebuild from a snapshot (or none) and the events after it: the one restart path."""
        config = config or EngineConfig()
        state = load_state(snapshot, config) if snapshot is not None else State(config)
        for i, event in enumerate(events):
            if event.seq != state.seq + 1:
                if i == 0 and snapshot is not None:
                    raise SnapshotMismatch(
                        f"snapshot ends at seq {state.seq} but the log continues at {event.seq}"
                    )
                raise LogGap(f"expected seq {state.seq + 1}, found {event.seq}")
            try:
                state.apply(event)
            except (KeyError, AssertionError) as exc:
                kind = type(event).__name__
                raise RecordError(f"event {event.seq} ({kind}) does not apply: {exc!r}") from exc
        now = clock.now_ms()
        # heartbeats are not recorded: every open session gets one fresh TTL
        for session in state.sessions.values():
            if session.state is SessionState.OPEN:
                session.expires_ms = now + session.ttl_ms
        engine = cls(clock, sink, config, _state=state)
        engine.tick()
        return engine

    def snapshot(self) -> dict[str, Any]:
        """The whole durable state as JSON-able data (``seq`` says which events it covers)."""
        return dump_state(self._core.state)

    @property
    def last_seq(self) -> int:
        return self._core.state.seq

    @property
    def state(self) -> State:
        """Read-only view for checkers and metrics; mutate only through the methods."""
        return self._core.state

    @property
    def _now_ms(self) -> int:
        """The engine's time as of its last step (the invariant checker reads it)."""
        return self._core.now_ms

    def _fits(self, node: Node, cls: str) -> Node | None:
        """The lease book's fit test (the invariant checker's work-conserving check)."""
        return self._leases.fits(node, cls)

    def queued(self) -> list[Waiter]:
        return self._leases.queued()

    def activity(self, node_id: int) -> tuple[dict[str, int], dict[str, int]]:
        """What a node has in flight beyond its counters, for GetNode and the terminal UI:
        acquires waiting in the fair queue per class, and units of unexpired credit blocks
        out per rated resource. Off the hot path (it scans the node's queues and blocks)."""
        self._core.node(node_id)
        return self._leases.waiting_at(node_id), self._credit.outstanding_at(node_id)

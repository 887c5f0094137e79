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

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from . import _events as ev
from ._core import EventSink, _caps, _ident, _int, _name
from ._credit import CreditMixin, check_rates
from ._errors import (
    InvalidArgument,
    LogGap,
    NotFound,
    RecordError,
    SnapshotMismatch,
)
from ._fairq import ClassQueue, Waiter
from ._housekeeping import HousekeepingMixin
from ._leasing import LeasingMixin
from ._policies import PoliciesMixin
from ._snapshot import dump_state, load_state
from ._state import ROOT_ID, State
from ._timers import Timers
from ._types import (
    AdaptiveConfig,
    Clock,
    Consumed,
    Created,
    Defaults,
    Denial,
    DenyReason,
    Edited,
    EngineConfig,
    Granted,
    NodeState,
    Rate,
    RequestTag,
    SessionState,
)

__all__ = ["Engine", "COOLDOWN_MS_MAX", "COOLDOWNS_PER_NODE_MAX"]

COOLDOWN_MS_MAX = 86_400_000  # a day: a cooldown is a back-off, not a switch
COOLDOWNS_PER_NODE_MAX = 64  # live named cooldowns one node holds


class Engine(CreditMixin, LeasingMixin, HousekeepingMixin, PoliciesMixin):
    """The tree of caps and leases, the fair queue and the adaptive limits, behind one lock."""

    def __init__(
        self,
        clock: Clock,
        sink: EventSink,
        config: EngineConfig | None = None,
        *,
        _state: State | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self._clock = clock
        self._sink = sink
        self._state = _state or State(self.config)
        self._now_ms = 0
        self._timers = Timers()
        self._queues: dict[str, ClassQueue] = {}
        self._waiting: dict[int, Waiter] = {}
        self._pending_rids: dict[tuple[int, str], int] = {}
        self._outcomes: OrderedDict[int, tuple[int, Granted | Denial]] = OrderedDict()
        self._next_waiter = 1
        self._rebuild_timers()

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
        engine._advance()
        return engine

    def snapshot(self) -> dict[str, Any]:
        """The whole durable state as JSON-able data (``seq`` says which events it covers)."""
        return dump_state(self._state)

    @property
    def last_seq(self) -> int:
        return self._state.seq

    @property
    def state(self) -> State:
        """Read-only view for checkers and metrics; mutate only through the methods."""
        return self._state

    def effective_deadline_ms(self, node_id: int) -> int | None:
        """The earliest deadline on the node's chain: a child never outlives its parent."""
        if _ident("node_id", node_id) not in self._state.nodes:
            raise NotFound("node_id", f"no node {node_id!r}")
        found = [n.deadline_ms for n in self._state.chain(node_id) if n.deadline_ms is not None]
        return min(found) if found else None

    def queued(self) -> list[Waiter]:
        return [w for q in self._queues.values() for w in q.waiters()]

    def activity(self, node_id: int) -> tuple[dict[str, int], dict[str, int]]:
        """What a node has in flight beyond its counters, for GetNode and the terminal UI:
        acquires waiting in the fair queue per class, and units of unexpired credit blocks
        out per rated resource. Off the hot path (it scans the node's queues and blocks)."""
        if _ident("node_id", node_id) not in self._state.nodes:
            raise NotFound("node_id", f"no node {node_id!r}")
        waiting: dict[str, int] = {}
        for cls, q in sorted(self._queues.items()):
            n = sum(1 for w in q.waiters() if w.node_id == node_id)
            if n:
                waiting[cls] = n
        now = self._now()
        credit = {
            resource: b.outstanding(now)
            for (nid, resource), b in sorted(self._state.credit.buckets.items())
            if nid == node_id and b.blocks
        }
        return waiting, {k: v for k, v in credit.items() if v}

    # ---- sessions ------------------------------------------------------------------------

    def open_session(
        self, scope_id: int, ttl_ms: int, token_sha256: str, *, key_sha256: str | None = None
    ) -> tuple[int, int]:
        """Open a session confined to ``scope_id``'s subtree; returns (session_id, expires_ms).

        ``key_sha256`` marks a bare API key's session, found again by ``session_for_key``: the
        driver gives it a random token it never hands out, so only the key reaches it."""
        now = self._advance()
        _int("ttl_ms", ttl_ms, 1)
        for field, digest in (("token_sha256", token_sha256), ("key_sha256", key_sha256)):
            if digest is None and field == "key_sha256":
                continue
            if not isinstance(digest, str) or len(digest) != 64:
                raise InvalidArgument(field, "must be 64 hex characters")
        if key_sha256 is not None and key_sha256 in self._state.by_key:
            raise InvalidArgument("key_sha256", "the key has an open session")
        if _ident("scope_id", scope_id) not in self._state.nodes:
            raise NotFound("scope_id", f"no node {scope_id}")
        sid = self._state.next_id
        self._emit(
            ev.SessionOpened(self._seq(), now, sid, scope_id, ttl_ms, token_sha256, key_sha256)
        )
        return sid, now + ttl_ms

    def heartbeat(self, session_id: int) -> int:
        """Renew the session's TTL (not recorded); returns the new expiry."""
        now = self._advance()
        session = self._session(session_id)
        session.expires_ms = now + session.ttl_ms
        self._timers.add_expiry(session.expires_ms, session.id)
        return session.expires_ms

    def close_session(self, session_id: int) -> None:
        now = self._advance()
        session = self._session(session_id)
        self._end_session(session, SessionState.CLOSED, now)
        self._dispatch()

    def session_for_token(self, token_sha256: str) -> int | None:
        """The open session a token's SHA-256 belongs to (the driver hashes what a caller sends)."""
        return self._state.by_token.get(token_sha256)

    def session_for_key(self, key_sha256: str) -> int | None:
        """The open session of a bare API key (by the key's SHA-256), if it has one."""
        return self._state.by_key.get(key_sha256)

    # ---- the tree ------------------------------------------------------------------------

    def create_node(
        self,
        session_id: int | None,
        parent_id: int,
        name: str,
        *,
        quotas: dict[str, int] | None = None,
        limits: dict[str, int] | None = None,
        weight: int | None = None,
        priority: int | None = None,
        deadline_ms: int | None = None,
        defaults: Defaults | None = None,
        request_id: str | None = None,
        rates: dict[str, Rate] | None = None,
    ) -> Created | Denial:
        """A child of ``parent_id``; what is not given comes from the parent's defaults."""
        now = self._advance()
        session = self._caller(session_id)
        _name("name", name)
        q, lim = _caps("quotas", quotas), _caps("limits", limits)
        rated = check_rates("rates", rates)
        if weight is not None:
            _int("weight", weight, 1)
        if priority is not None:
            _int("priority", priority, -(2**31))
        if deadline_ms is not None:
            _int("deadline_ms", deadline_ms)
        if defaults is not None and not isinstance(defaults, Defaults):
            raise InvalidArgument("defaults", "must be a Defaults")
        fp = (
            "create",
            parent_id,
            name,
            q,
            lim,
            weight,
            priority,
            deadline_ms,
            defaults,
        ) + ((rated,) if rated else ())
        tag, hit = self._recall(session, request_id, fp)
        if hit is not None:
            return hit  # type: ignore[return-value]
        parent = self._resolve(session, parent_id, edit=False)
        if parent.state is not NodeState.ACTIVE:
            return Denial(DenyReason.NODE_ENDED, parent.id)
        if parent.tenant is not None:  # a tenant itself (a child of the root) is the operator's
            held, most = self._state.tenant_nodes[parent.tenant], self.config.nodes_per_tenant_max
            if held >= most:
                return Denial(DenyReason.NODES, parent.tenant, "nodes", held, most, 1)
        inherited = parent.defaults or Defaults()
        node_id = self._state.next_node_id
        self._emit(
            ev.NodeCreated(
                self._seq(),
                now,
                node_id,
                parent.id,
                name,
                {**dict(inherited.quotas), **q},
                {**dict(inherited.limits), **lim},
                weight if weight is not None else (inherited.weight or 1),
                priority if priority is not None else (inherited.priority or 0),
                deadline_ms,
                defaults if defaults is not None else inherited.children,
                session_id,
                tag,
                rated,
            )
        )
        self._advance()
        return Created(node_id)

    def consume(
        self,
        session_id: int | None,
        node_id: int,
        resource: str,
        amount: int,
        request_id: str | None = None,
    ) -> Consumed | Denial:
        """Charge ``amount`` to the node and every ancestor, or to none of them."""
        now = self._advance()
        session = self._session(session_id) if session_id is not None else None
        if type(resource) is not str or not 0 < len(resource) <= 256:
            _name("resource", resource)
        if type(amount) is not int or amount < 1:
            _int("amount", amount, 1)
        tag = None
        if request_id is not None:
            tag, hit = self._recall(session, request_id, ("consume", node_id, resource, amount))
            if hit is not None:
                return hit  # type: ignore[return-value]
        chain = self._resolve_chain(session, node_id, edit=False)
        node = chain[0]
        if node.state is not NodeState.ACTIVE:
            return Denial(DenyReason.NODE_ENDED, node.id)
        for a in chain:
            limit = a.quotas.get(resource)
            if limit is not None:
                used = a.used.get(resource, 0)
                if amount > limit - used:
                    top = self._top_consumer(a, resource)
                    return Denial(DenyReason.QUOTA, a.id, resource, used, limit, amount, top)
        self._emit(ev.Charged(self._seq(), now, node_id, resource, amount, session_id, tag))
        return Consumed(node_id, resource, amount)

    def end_node(
        self,
        session_id: int | None,
        node_id: int,
        state: NodeState = NodeState.DONE,
        request_id: str | None = None,
    ) -> Edited:
        """Finish or cancel a node; its live descendants are cancelled and their leases end."""
        now = self._advance()
        session = self._caller(session_id)
        if state not in (NodeState.DONE, NodeState.CANCELLED):
            raise InvalidArgument("state", "must be DONE or CANCELLED")
        tag, hit = self._recall(session, request_id, ("end", node_id, state.value))
        if hit is not None:
            return hit  # type: ignore[return-value]
        node = self._resolve(session, node_id, edit=True)
        if node.id == ROOT_ID:
            raise InvalidArgument("node_id", "the root cannot end")
        if node.state is NodeState.ACTIVE:
            self._end_subtree(node, state, session_id, tag, now)
            self._dispatch()
        return Edited(node.id)

    # ---- edits -------------------------------------------------------------------------

    def set_quota(
        self,
        session_id: int | None,
        node_id: int,
        resource: str,
        limit: int | None,
        request_id: str | None = None,
    ) -> Edited:
        """Set (or with ``None`` remove) a cap; lowering it below usage takes nothing back."""
        _name("resource", resource)
        if limit is not None:
            _int("limit", limit)
        return self._edit(
            session_id,
            node_id,
            request_id,
            ("quota", node_id, resource, limit),
            lambda seq, now, tag: ev.QuotaSet(seq, now, node_id, resource, limit, session_id, tag),
        )

    def set_limit(
        self,
        session_id: int | None,
        node_id: int,
        cls: str,
        limit: int | None,
        request_id: str | None = None,
    ) -> Edited:
        """Set (or remove) a concurrency limit; lowering it revokes no lease."""
        _name("cls", cls)
        if limit is not None:
            _int("limit", limit)
        return self._edit(
            session_id,
            node_id,
            request_id,
            ("limit", node_id, cls, limit),
            lambda seq, now, tag: ev.LimitSet(seq, now, node_id, cls, limit, session_id, tag),
        )

    def set_defaults(
        self,
        session_id: int | None,
        node_id: int,
        defaults: Defaults | None,
        request_id: str | None = None,
    ) -> Edited:
        if defaults is not None and not isinstance(defaults, Defaults):
            raise InvalidArgument("defaults", "must be a Defaults or None")
        return self._edit(
            session_id,
            node_id,
            request_id,
            ("defaults", node_id, defaults),
            lambda seq, now, tag: ev.DefaultsSet(seq, now, node_id, defaults, session_id, tag),
        )

    def set_weight(
        self,
        session_id: int | None,
        node_id: int,
        weight: int,
        request_id: str | None = None,
    ) -> Edited:
        _int("weight", weight, 1)
        return self._edit(
            session_id,
            node_id,
            request_id,
            ("weight", node_id, weight),
            lambda seq, now, tag: ev.WeightSet(seq, now, node_id, weight, session_id, tag),
        )

    def set_deadline(
        self,
        session_id: int | None,
        node_id: int,
        deadline_ms: int | None,
        request_id: str | None = None,
    ) -> Edited:
        if deadline_ms is not None:
            _int("deadline_ms", deadline_ms)
        return self._edit(
            session_id,
            node_id,
            request_id,
            ("deadline", node_id, deadline_ms),
            lambda seq, now, tag: ev.DeadlineSet(seq, now, node_id, deadline_ms, session_id, tag),
        )

    def set_cooldown(
        self,
        session_id: int | None,
        node_id: int,
        name: str,
        duration_ms: int,
        *,
        replace: bool = False,
        request_id: str | None = None,
    ) -> Edited:
        """Back callers of `name` off until now + `duration_ms`. A cooldown only grows
        (a later, shorter one keeps the longer end) unless `replace` (the operator's `gov
        cooldown`; 0 with replace clears it)."""
        _name("name", name)
        if type(duration_ms) is not int or not 0 <= duration_ms <= COOLDOWN_MS_MAX:
            raise InvalidArgument("duration_ms", f"must be 0..{COOLDOWN_MS_MAX} ms")
        node = self._state.nodes.get(_ident("node_id", node_id))
        if node is not None:
            now = self._now()
            live = {k for k, v in node.cooldowns.items() if v > now}
            if name not in live and len(live) >= COOLDOWNS_PER_NODE_MAX:
                raise InvalidArgument(
                    "name", f"node {node_id} has {COOLDOWNS_PER_NODE_MAX} live cooldowns"
                )

        def make(seq: int, now: int, tag: RequestTag | None) -> ev.Event:
            current = self._state.nodes[node_id].cooldowns.get(name, 0)
            until = now + duration_ms if replace else max(current, now + duration_ms)
            return ev.CooldownSet(seq, now, node_id, name, until, session_id, tag)

        return self._edit(
            session_id, node_id, request_id, ("cooldown", node_id, name, duration_ms, replace), make
        )

    def set_adaptive(self, cls: str, config: AdaptiveConfig | None) -> None:
        """Operator only: run AIMD on the root limit of ``cls`` (``None`` stops it)."""
        now = self._advance()
        _name("cls", cls)
        if config is not None:
            if not isinstance(config, AdaptiveConfig):
                raise InvalidArgument("config", "must be an AdaptiveConfig")
            _int("config.min_limit", config.min_limit)
            _int("config.max_limit", config.max_limit, config.min_limit)
            _int("config.initial_limit", config.initial_limit, config.min_limit)
            if config.initial_limit > config.max_limit:
                raise InvalidArgument("config.initial_limit", "must be <= max_limit")
            _int("config.interval_ms", config.interval_ms, 1)
            _int("config.min_samples", config.min_samples, 1)
        self._emit(ev.AdaptiveSet(self._seq(), now, cls, config))
        self._dispatch()

    def tick(self) -> None:
        """The reaper: expire sessions, fire deadlines, run AIMD, purge old records."""
        self._advance()

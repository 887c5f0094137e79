"""What every book of the engine shares: its state, scope resolution, idempotency, emit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _events as ev
from ._errors import (
    InvalidArgument,
    NotFound,
    OutOfScope,
    RequestIdReused,
    SessionEnded,
)
from ._state import Node, Result, Session, State
from ._timers import SCHEDULED, Timers, rebuild_timers, schedule
from ._types import (
    Clock,
    Denial,
    DenyReason,
    EngineConfig,
    NodeState,
    RequestTag,
    SessionState,
)

__all__ = ["Core", "EventSink"]

EventSink = Callable[[ev.Event], None]


def _int(field: str, value: object, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(field, f"must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidArgument(field, f"must be >= {minimum}, got {value}")
    return value


def _ident(field: str, value: object) -> int:
    """An id argument: an int, checked before it is used as a key."""
    if type(value) is not int:
        raise InvalidArgument(field, f"must be an int id, got {type(value).__name__}")
    return value


def _name(field: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise InvalidArgument(field, "must be a non-empty string of at most 256 characters")
    return value


def _caps(field: str, value: object) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be a dict of name to int")
    out = {_name(field, k): _int(f"{field}[{k}]", v) for k, v in value.items()}
    return dict(sorted(out.items()))


class Core:
    """What every book of the engine shares: the state, the clock, the event sink and the due
    times, with the checks every call makes (scope, idempotency). The engine is one object
    behind one lock, so the books share this one instance rather than copies."""

    __slots__ = ("config", "clock", "sink", "state", "now_ms", "timers")

    def __init__(self, config: EngineConfig, clock: Clock, sink: EventSink, state: State) -> None:
        self.config = config
        self.clock = clock
        self.sink = sink
        self.state = state
        self.now_ms = 0
        self.timers = Timers()
        rebuild_timers(self.timers, state, config)

    def seq(self) -> int:
        return self.state.seq + 1

    def emit(self, event: ev.Event) -> None:
        """Apply, put its due times on the timers, and hand it to the sink to make durable."""
        self.state.apply(event)
        if type(event) in SCHEDULED:
            schedule(self.timers, event, self.state, self.config)
        self.sink(event)

    def caller(self, session_id: int | None) -> Session | None:
        """``None`` is the operator (configuration); otherwise the session must be open."""
        if session_id is None:
            return None
        return self.session(session_id)

    def session(self, session_id: int) -> Session:
        session = self.state.sessions.get(_ident("session_id", session_id))
        if session is None:
            raise NotFound("session_id", f"no session {session_id}")
        if session.state is not SessionState.OPEN:
            raise SessionEnded(f"session {session_id} is {session.state.value}")
        return session

    def resolve(self, session: Session | None, node_id: int, *, edit: bool) -> Node:
        return self.resolve_chain(session, node_id, edit=edit)[0]

    def resolve_chain(self, session: Session | None, node_id: int, *, edit: bool) -> list[Node]:
        """The one place a target is checked against the caller's scope; returns its chain
        (the node and its ancestors, leaf first) so callers need not walk it again."""
        nodes = self.state.nodes
        node = nodes.get(_ident("node_id", node_id))
        if node is None:
            raise NotFound("node_id", f"no node {node_id!r}")
        scope = session.scope_id if session is not None else None
        inside = session is None
        chain = [node]
        cur = node
        while cur.parent is not None:
            if cur.id == scope:
                inside = True
            cur = nodes[cur.parent]
            chain.append(cur)
        if cur.id == scope:
            inside = True
        if not inside:
            raise OutOfScope(f"node {node_id} is outside this session's scope")
        if edit and node.id == scope:
            raise OutOfScope(f"node {node_id} is this session's scope node")
        return chain

    def live_chain(self, session: Session | None, node_id: int) -> list[Node] | Denial:
        """The chain a charge lands on, or the denial that its node has ended."""
        chain = self.resolve_chain(session, node_id, edit=False)
        if chain[0].state is not NodeState.ACTIVE:
            return Denial(DenyReason.NODE_ENDED, chain[0].id)
        return chain

    def node(self, node_id: int) -> Node:
        """A node by id, for the read-only calls that take no session."""
        node = self.state.nodes.get(_ident("node_id", node_id))
        if node is None:
            raise NotFound("node_id", f"no node {node_id!r}")
        return node

    def recall(
        self, session: Session | None, request_id: str | None, fp: tuple[Any, ...]
    ) -> tuple[RequestTag | None, Result | None]:
        """Idempotency: a known id returns its first result; with other arguments, an error."""
        if request_id is None:
            return None, None
        if session is None:
            raise InvalidArgument("request_id", "needs a session")
        _name("request_id", request_id)
        fingerprint = repr(fp)
        known = session.memory.get(request_id)
        if known is not None:
            if known[0] != fingerprint:
                raise RequestIdReused("request_id", f"{request_id!r} was used with other arguments")
            return None, known[1]
        return RequestTag(request_id, fingerprint), None

    def top_consumer(self, node: Node, resource: str) -> int:
        best_id, best = node.id, node.direct.get(resource, 0)
        for cid in sorted(node.children):
            used = self.state.nodes[cid].used.get(resource, 0)
            if used > best:
                best_id, best = cid, used
        return best_id

    def now(self) -> int:
        """The engine's time without doing the work it makes due (for reads and checks)."""
        now = self.clock.now_ms()
        if now > self.now_ms:
            self.now_ms = now
        return self.now_ms

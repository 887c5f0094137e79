"""What every part of the engine shares: its fields, scope resolution, idempotency, emit."""

from __future__ import annotations

import math
from collections import OrderedDict
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
from ._fairq import ClassQueue, Waiter
from ._state import Node, Result, Session, State
from ._timers import Timers
from ._types import (
    Clock,
    Denial,
    Edited,
    EngineConfig,
    Granted,
    NodeState,
    RequestTag,
    SessionState,
)

__all__ = ["EventSink", "_Core"]

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


class _Core:
    """Fields and helpers shared by the engine's parts (the engine is one object, one lock)."""

    config: EngineConfig
    _clock: Clock
    _sink: EventSink
    _state: State
    _now_ms: int
    _timers: Timers
    _queues: dict[str, ClassQueue]
    _waiting: dict[int, Waiter]
    _pending_rids: dict[tuple[int, str], int]
    _outcomes: OrderedDict[int, tuple[int, Granted | Denial]]
    _next_waiter: int

    def _advance(self) -> int:
        raise NotImplementedError

    def _dispatch(self) -> None:
        raise NotImplementedError

    def _schedule(self, event: ev.Event) -> None:
        raise NotImplementedError

    def _end_session(self, session: Session, state: SessionState, now: int) -> None:
        raise NotImplementedError

    def _end_subtree(
        self,
        node: Node,
        state: NodeState,
        session_id: int | None,
        tag: RequestTag | None,
        now: int,
    ) -> None:
        raise NotImplementedError

    # ---- shared helpers ------------------------------------------------------------------

    def _seq(self) -> int:
        return self._state.seq + 1

    def _emit(self, event: ev.Event) -> None:
        self._state.apply(event)
        self._schedule(event)
        self._sink(event)

    def _edit(
        self,
        session_id: int | None,
        node_id: int,
        request_id: str | None,
        fp: tuple[Any, ...],
        make: Callable[[int, int, RequestTag | None], ev.Event],
    ) -> Edited:
        now = self._advance()
        session = self._caller(session_id)
        tag, hit = self._recall(session, request_id, fp)
        if hit is not None:
            return hit  # type: ignore[return-value]
        node = self._resolve(session, node_id, edit=True)
        self._emit(make(self._seq(), now, tag))
        self._advance()
        self._dispatch()
        return Edited(node.id)

    def _caller(self, session_id: int | None) -> Session | None:
        """``None`` is the operator (configuration); otherwise the session must be open."""
        if session_id is None:
            return None
        return self._session(session_id)

    def _session(self, session_id: int) -> Session:
        session = self._state.sessions.get(_ident("session_id", session_id))
        if session is None:
            raise NotFound("session_id", f"no session {session_id}")
        if session.state is not SessionState.OPEN:
            raise SessionEnded(f"session {session_id} is {session.state.value}")
        return session

    def _resolve(self, session: Session | None, node_id: int, *, edit: bool) -> Node:
        return self._resolve_chain(session, node_id, edit=edit)[0]

    def _resolve_chain(self, session: Session | None, node_id: int, *, edit: bool) -> list[Node]:
        """The one place a target is checked against the caller's scope; returns its chain
        (the node and its ancestors, leaf first) so callers need not walk it again."""
        nodes = self._state.nodes
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

    def _recall(
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

    def _top_consumer(self, node: Node, resource: str) -> int:
        best_id, best = node.id, node.direct.get(resource, 0)
        for cid in sorted(node.children):
            used = self._state.nodes[cid].used.get(resource, 0)
            if used > best:
                best_id, best = cid, used
        return best_id

    def _now(self) -> int:
        now = self._clock.now_ms()
        if now > self._now_ms:
            self._now_ms = now
        return self._now_ms

    @staticmethod
    def _p95(samples: list[tuple[int, bool]]) -> int:
        ordered = sorted(s[0] for s in samples)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]

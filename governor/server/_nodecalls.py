"""Node calls: create (or ensure), read, watch, end; consume; and the edits of a node's caps,
limits, cooldowns and defaults. A read answers only inside the caller's scope."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from governor.engine import (
    Consumed,
    Created,
    Defaults,
    Denial,
    Engine,
    GovernorError,
    NodeState,
    NotFound,
    OutOfScope,
    Rate,
    SessionEnded,
    SessionState,
)

from ._calls import Impl, Principal, Steps
from ._status import denial_fail, error_fail

__all__ = ["NodeCalls"]

WATCH_POLL_S = 0.05


def _defaults(data: dict[str, Any] | None) -> Defaults | None:
    if data is None:
        return None

    def caps(v: Any) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((k, n) for k, n in (v or {}).items() if n is not None))

    return Defaults(
        quotas=caps(data.get("quotas")),
        limits=caps(data.get("limits")),
        weight=data.get("weight"),
        priority=data.get("priority"),
        children=_defaults(data.get("children")),
    )


def _caps(v: dict[str, Any] | None) -> dict[str, int] | None:
    return None if v is None else {k: n for k, n in v.items() if n is not None}


def _rates(v: dict[str, Any] | None) -> dict[str, Rate] | None:
    """A node's rates from the wire (``resource -> [per_s, burst]``; wire.py checked the
    shape, the engine checks the ranges)."""
    return None if v is None else {k: Rate(int(r[0]), int(r[1])) for k, r in v.items()}


def _in_scope(engine: Engine, scope_id: int, node_id: int) -> bool:
    nodes = engine.state.nodes
    cur = nodes.get(node_id)
    while cur is not None:
        if cur.id == scope_id:
            return True
        cur = nodes.get(cur.parent) if cur.parent is not None else None
    return False


def _node_info(engine: Engine, node_id: int) -> dict[str, Any]:
    n = engine.state.nodes[node_id]
    waiting, credit = engine.activity(node_id)
    return {
        "node_id": n.id,
        "parent_id": n.parent,
        "name": n.name,
        "state": n.state.value,
        "quotas": dict(n.quotas),
        "limits": dict(n.limits),
        "used": dict(n.used),
        "held": {k: v for k, v in n.held.items() if v},
        "weight": n.weight,
        "priority": n.priority,
        "deadline_ms": n.deadline_ms,
        "effective_deadline_ms": engine.effective_deadline_ms(n.id),
        "children": sorted(n.children),
        "waiting": waiting,  # acquires queued per class
        "credit_outstanding": credit,  # units of live credit blocks per rated resource
        "cooldowns": dict(sorted(n.cooldowns.items())),  # name -> until (epoch ms)
        **_rates_info(engine, n.id),
    }


def _rates_info(engine: Engine, node_id: int) -> dict[str, Any]:
    """A rated node's rates (``resource -> [per_s, burst]``); nothing for an unrated one."""
    rates = {
        resource: [b.rate.per_s, b.rate.burst]
        for (nid, resource), b in sorted(engine.state.credit.buckets.items())
        if nid == node_id
    }
    return {"rates": rates} if rates else {}


def _credit_info(engine: Engine, node_id: int) -> dict[str, Any]:
    """A rated node's buckets now, in whole units. Only GetNode shows them: a level moves
    with time, so WatchNode (which streams every change) leaves it out."""
    credit = {}
    for resource in _rates_info(engine, node_id).get("rates", {}):
        view = engine.credit_level(node_id, resource)
        assert view is not None
        credit[resource] = {"level": view[0], "outstanding": view[1]}
    return {"credit": credit} if credit else {}


class NodeCalls:
    def __init__(self, steps: Steps) -> None:
        self._steps = steps

    def calls(self) -> dict[str, Impl]:
        return {
            "CreateNode": self.create_node,
            "EnsureNode": self.ensure_node,
            "GetNode": self.get_node,
            "CancelNode": self.cancel_node,
            "CloseNode": self.close_node,
            "Consume": self.consume,
            "SetQuota": self.set_quota,
            "SetLimit": self.set_limit,
            "SetCooldown": self.set_cooldown,
            "SetDefaults": self.set_defaults,
        }

    def _create(self, e: Engine, who: Principal, b: dict[str, Any]) -> Created | Denial:
        return e.create_node(
            who.session_id,
            b["parent_id"] if b["parent_id"] is not None else who.scope_id,
            b["name"],
            quotas=_caps(b["quotas"]),
            limits=_caps(b["limits"]),
            weight=b["weight"],
            priority=b["priority"],
            deadline_ms=b["deadline_ms"],
            defaults=_defaults(b["defaults"]),
            request_id=b["request_id"],
            rates=_rates(b.get("rates")),
        )

    async def create_node(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        result = await self._steps.step(lambda e: self._create(e, who, b))
        if isinstance(result, Denial):
            raise denial_fail(result)
        assert isinstance(result, Created)
        return {"node_id": result.node_id, "created": True}

    async def ensure_node(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        """The active child of ``parent_id`` named ``name``, created if there is none."""
        assert who is not None
        parent_id = b["parent_id"] if b["parent_id"] is not None else who.scope_id

        def ensure(e: Engine) -> tuple[Created | Denial, bool]:
            parent = e.state.nodes.get(parent_id)
            if parent is not None and _in_scope(e, who.scope_id, parent_id):
                for cid in sorted(parent.children):
                    child = e.state.nodes[cid]
                    if child.name == b["name"] and child.state is NodeState.ACTIVE:
                        return Created(cid), False
            return self._create(e, who, {**b, "parent_id": parent_id}), True

        result, created = await self._steps.step(ensure)
        if isinstance(result, Denial):
            raise denial_fail(result)
        return {"node_id": result.node_id, "created": created}

    def _readable(self, e: Engine, who: Principal, node_id: int) -> None:
        if node_id not in e.state.nodes:
            raise NotFound("node_id", f"no node {node_id}")
        if not _in_scope(e, who.scope_id, node_id):
            raise OutOfScope(f"node {node_id} is outside this session's scope")

    async def get_node(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        node_id = b["node_id"] if b["node_id"] is not None else who.scope_id

        def get(e: Engine) -> dict[str, Any]:
            self._readable(e, who, node_id)
            return {**_node_info(e, node_id), **_credit_info(e, node_id)}

        info: dict[str, Any] = await self._steps.step(get)
        return info

    async def _end(
        self, who: Principal | None, b: dict[str, Any], state: NodeState
    ) -> dict[str, Any]:
        assert who is not None
        await self._steps.step(
            lambda e: e.end_node(who.session_id, b["node_id"], state, request_id=b["request_id"])
        )
        return {"node_id": b["node_id"]}

    async def cancel_node(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        return await self._end(who, b, NodeState.CANCELLED)

    async def close_node(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        return await self._end(who, b, NodeState.DONE)

    async def watch(self, who: Principal, b: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The node's state now, then again each time it changes, until it ends."""
        node_id = b["node_id"]
        last: dict[str, Any] | None = None
        while True:

            def read(e: Engine) -> dict[str, Any]:
                session = e.state.sessions.get(who.session_id)
                if session is None or session.state is not SessionState.OPEN:
                    raise SessionEnded(f"session {who.session_id} has ended")
                self._readable(e, who, node_id)
                return _node_info(e, node_id)

            try:
                info = self._steps.authority.read(read)
            except GovernorError as exc:
                raise error_fail(exc) from exc
            if info != last:
                yield info
                last = info
            if info["state"] != NodeState.ACTIVE.value:
                return
            await asyncio.sleep(WATCH_POLL_S)

    async def consume(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        amount = b["amount"] if b["amount"] is not None else 1
        result = await self._steps.step(
            lambda e: e.consume(
                who.session_id, b["node_id"], b["resource"], amount, b["request_id"]
            )
        )
        if isinstance(result, Denial):
            raise denial_fail(result)
        assert isinstance(result, Consumed)
        return {"node_id": result.node_id, "resource": result.resource, "amount": result.amount}

    async def set_quota(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        sid = who.session_id
        return await self._steps.edit(
            lambda e: e.set_quota(sid, b["node_id"], b["resource"], b["limit"], b["request_id"])
        )

    async def set_limit(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        sid = who.session_id
        return await self._steps.edit(
            lambda e: e.set_limit(sid, b["node_id"], b["cls"], b["limit"], b["request_id"])
        )

    async def set_cooldown(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        sid = who.session_id

        def go(e: Engine) -> dict[str, Any]:
            r = e.set_cooldown(
                sid,
                b["node_id"],
                b["name"],
                b["duration_ms"],
                replace=bool(b["replace"]),
                request_id=b["request_id"],
            )
            until = e.state.nodes[r.node_id].cooldowns.get(b["name"], 0)
            return {"node_id": r.node_id, "until_ms": until}

        reply: dict[str, Any] = await self._steps.step(go)
        return reply

    async def set_defaults(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        sid, defaults = who.session_id, _defaults(b["defaults"])
        return await self._steps.edit(
            lambda e: e.set_defaults(sid, b["node_id"], defaults, b["request_id"])
        )

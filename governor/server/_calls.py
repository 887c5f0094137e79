"""The calls, one method each: validated body in, one engine step, reply after commit.
The plumbing they run in (auth, in-flight idempotency, status mapping) is ``_service``."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from governor.authority import Authority
from governor.config import GovernordConfig
from governor.engine import (
    Consumed,
    Created,
    CreditGrant,
    CreditReturn,
    Defaults,
    Denial,
    Edited,
    Engine,
    GovernorError,
    Granted,
    LeaseEnd,
    LeaseStatus,
    NodeState,
    NotFound,
    OutOfScope,
    Queued,
    Rate,
    Released,
    SessionEnded,
    SessionState,
)

from ._commit import CommitWaits
from ._status import Fail, denial_fail, error_fail, sha256_hex

__all__ = ["CallsMixin", "Principal"]

WATCH_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class Principal:
    session_id: int
    scope_id: int
    tenant: str
    by_key: bool


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


class CallsMixin:
    authority: Authority
    config: GovernordConfig
    commits: CommitWaits
    _changed: asyncio.Event

    async def _step(self, fn: Callable[[Engine], Any]) -> Any:
        raise NotImplementedError

    # ---- sessions --------------------------------------------------------------------------

    async def _OpenSession(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        cfg = self.config
        ttl = b["ttl_ms"] or cfg.session_ttl_ms
        if not cfg.session_ttl_min_ms <= ttl <= cfg.session_ttl_max_ms:
            raise Fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                "invalid_argument",
                f"ttl_ms: must lie in [{cfg.session_ttl_min_ms}, {cfg.session_ttl_max_ms}]",
                field="ttl_ms",
            )
        token = secrets.token_urlsafe(32)  # 256 random bits; only its SHA-256 is stored
        sid, expires = await self._step(
            lambda e: e.open_session(who.scope_id, ttl, sha256_hex(token))
        )
        return {
            "session_id": sid,
            "token": token,
            "expires_ms": expires,
            "ttl_ms": ttl,
            "scope_id": who.scope_id,
            "tenant": who.tenant,
        }

    async def _Heartbeat(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        expires = await self._step(lambda e: e.heartbeat(who.session_id))
        return {"expires_ms": expires}

    async def _CloseSession(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        await self._step(lambda e: e.close_session(who.session_id))
        return {}

    # ---- nodes -----------------------------------------------------------------------------

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

    async def _CreateNode(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        result = await self._step(lambda e: self._create(e, who, b))
        if isinstance(result, Denial):
            raise denial_fail(result)
        assert isinstance(result, Created)
        return {"node_id": result.node_id, "created": True}

    async def _EnsureNode(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
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

        result, created = await self._step(ensure)
        if isinstance(result, Denial):
            raise denial_fail(result)
        return {"node_id": result.node_id, "created": created}

    def _readable(self, e: Engine, who: Principal, node_id: int) -> None:
        if node_id not in e.state.nodes:
            raise NotFound("node_id", f"no node {node_id}")
        if not _in_scope(e, who.scope_id, node_id):
            raise OutOfScope(f"node {node_id} is outside this session's scope")

    async def _GetNode(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        node_id = b["node_id"] if b["node_id"] is not None else who.scope_id

        def get(e: Engine) -> dict[str, Any]:
            self._readable(e, who, node_id)
            return {**_node_info(e, node_id), **_credit_info(e, node_id)}

        info: dict[str, Any] = await self._step(get)
        return info

    async def _end(
        self, who: Principal | None, b: dict[str, Any], state: NodeState
    ) -> dict[str, Any]:
        assert who is not None
        await self._step(
            lambda e: e.end_node(who.session_id, b["node_id"], state, request_id=b["request_id"])
        )
        return {"node_id": b["node_id"]}

    async def _CancelNode(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        return await self._end(who, b, NodeState.CANCELLED)

    async def _CloseNode(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        return await self._end(who, b, NodeState.DONE)

    async def _watch(self, who: Principal, b: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
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
                info = self.authority.read(read)
            except GovernorError as exc:
                raise error_fail(exc) from exc
            if info != last:
                yield info
                last = info
            if info["state"] != NodeState.ACTIVE.value:
                return
            await asyncio.sleep(WATCH_POLL_S)

    # ---- consume and leases ----------------------------------------------------------------

    async def _Consume(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        amount = b["amount"] if b["amount"] is not None else 1
        result = await self._step(
            lambda e: e.consume(
                who.session_id, b["node_id"], b["resource"], amount, b["request_id"]
            )
        )
        if isinstance(result, Denial):
            raise denial_fail(result)
        assert isinstance(result, Consumed)
        return {"node_id": result.node_id, "resource": result.resource, "amount": result.amount}

    async def _Acquire(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        """Wait in the fair queue; a cancelled call leaves no lease behind."""
        assert who is not None
        sid = who.session_id
        result = await self._step(
            lambda e: e.acquire(sid, b["node_id"], b["cls"], request_id=b["request_id"])
        )
        if isinstance(result, Queued):
            result = await self._wait_grant(sid, result.waiter_id, b["timeout_ms"])
        if isinstance(result, Denial):
            raise denial_fail(result)
        assert isinstance(result, Granted)
        return {"lease_id": result.lease_id, "node_id": result.node_id, "cls": result.cls}

    async def _wait_grant(self, sid: int, waiter_id: int, timeout_ms: int | None) -> Any:
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        try:
            while True:
                changed = self._changed
                outcome = await self._step(lambda e: e.take_outcome(sid, waiter_id))
                if outcome is not None:
                    return outcome
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError
                try:
                    await asyncio.wait_for(changed.wait(), min(remaining or 1.0, 1.0))
                except TimeoutError:
                    pass
        except TimeoutError:
            await self._step(lambda e: e.cancel_wait(sid, waiter_id))
            raise Fail(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "timeout",
                f"no lease within timeout_ms={timeout_ms}",
            ) from None
        except asyncio.CancelledError:
            self.authority.step(lambda e: e.cancel_wait(sid, waiter_id))
            raise

    async def _Release(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        result = await self._step(
            lambda e: e.release(
                who.session_id,
                b["lease_id"],
                latency_ms=b["latency_ms"],
                overloaded=bool(b["overloaded"]),
                request_id=b["request_id"],
            )
        )
        assert isinstance(result, Released)
        if not result.by_this_call and result.end is not LeaseEnd.RELEASED:
            raise Fail(
                grpc.StatusCode.FAILED_PRECONDITION,
                "lease_ended",
                f"lease {result.lease_id} ended before this release: {result.end.value}",
                end=result.end.value,
                lease_id=result.lease_id,
            )
        return {"lease_id": result.lease_id, "released": result.by_this_call}

    async def _Validate(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        status = await self._step(lambda e: e.validate(b["lease_id"]))
        assert isinstance(status, LeaseStatus)  # _step confirmed the epoch: a read
        return {
            "lease_id": status.lease_id,
            "live": status.live,
            "end": None if status.end is None else status.end.value,
        }

    # ---- edits -----------------------------------------------------------------------------

    async def _SetQuota(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        sid = who.session_id
        return await self._edit(
            lambda e: e.set_quota(sid, b["node_id"], b["resource"], b["limit"], b["request_id"])
        )

    async def _SetLimit(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        sid = who.session_id
        return await self._edit(
            lambda e: e.set_limit(sid, b["node_id"], b["cls"], b["limit"], b["request_id"])
        )

    async def _SetCooldown(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
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

        reply: dict[str, Any] = await self._step(go)
        return reply

    async def _SetDefaults(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        sid, defaults = who.session_id, _defaults(b["defaults"])
        return await self._edit(
            lambda e: e.set_defaults(sid, b["node_id"], defaults, b["request_id"])
        )

    # ---- credit blocks (docs/strict.md) ----------------------------------------------------

    async def _ReserveCredit(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        """A credit block, logged before this reply; the worker times it from its send."""
        assert who is not None
        result = await self._step(
            lambda e: e.reserve_credit(
                who.session_id,
                b["node_id"],
                b["resource"],
                b["units"],
                request_id=b["request_id"],
            )
        )
        if isinstance(result, Denial):
            raise denial_fail(result)
        assert isinstance(result, CreditGrant)
        return {
            "block_id": result.block_id,
            "node_id": result.node_id,
            "resource": result.resource,
            "units": result.units,
            "ttl_ms": result.ttl_ms,
            "expires_ms": result.expires_ms,
        }

    async def _ReturnCredit(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        """Unused units back, once per block id; a second return is a no-op answer."""
        assert who is not None
        result = await self._step(
            lambda e: e.return_credit(
                who.session_id, b["block_id"], b["unused"], request_id=b["request_id"]
            )
        )
        assert isinstance(result, CreditReturn)
        return {
            "block_id": result.block_id,
            "returned": result.applied,
            "end": result.end.value,
        }

    async def _SetRate(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        sid = who.session_id
        if (b["per_s"] is None) != (b["burst"] is None):
            field = "burst" if b["burst"] is None else "per_s"
            raise Fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                "invalid_argument",
                f"{field}: per_s and burst come together (both nil removes the rate)",
                field=field,
            )
        rate = None if b["per_s"] is None else Rate(b["per_s"], b["burst"])
        return await self._edit(
            lambda e: e.set_rate(sid, b["node_id"], b["resource"], rate, b["request_id"])
        )

    async def _edit(self, fn: Callable[[Engine], Any]) -> dict[str, Any]:
        """An edit's step, and its reply: the node it changed."""
        r = await self._step(fn)
        assert isinstance(r, Edited)
        return {"node_id": r.node_id}

"""Leases: acquire (now or through the fair queue), release, validate, and how leases end.

Lease ids and session ids come from one counter that only grows, so a larger id is a later grant:
a downstream that remembers the largest id it has seen can fence off a paused worker.
"""

from __future__ import annotations

from . import _events as ev
from ._core import _Core, _ident, _int, _name
from ._errors import InvalidArgument, NotFound, NotOwner
from ._fairq import ClassQueue, Waiter
from ._state import ROOT_ID, Node, Session
from ._types import (
    Denial,
    DenyReason,
    Granted,
    LeaseEnd,
    LeaseStatus,
    NodeState,
    Queued,
    Released,
    RequestTag,
    SessionState,
)

__all__ = ["LeasingMixin"]


class LeasingMixin(_Core):
    def acquire(
        self,
        session_id: int,
        node_id: int,
        cls: str,
        *,
        wait: bool = True,
        request_id: str | None = None,
    ) -> Granted | Queued | Denial:
        """A lease of ``cls`` at ``node_id`` if every ancestor's limit has room, else a wait."""
        now = self._advance()
        session = self._session(session_id)
        _name("cls", cls)
        tag, hit = self._recall(session, request_id, ("acquire", node_id, cls))
        if hit is not None:
            return hit  # type: ignore[return-value]
        if tag is not None and (session.id, tag.request_id) in self._pending_rids:
            return Queued(self._pending_rids[(session.id, tag.request_id)])
        node = self._resolve(session, node_id, edit=False)
        if node.state is not NodeState.ACTIVE:
            return Denial(DenyReason.NODE_ENDED, node.id)
        blocking = self._fits(node, cls)
        if blocking is None:
            return self._grant(session.id, node, cls, tag, None, now)
        if not wait:
            held, limit = blocking.held.get(cls, 0), blocking.limits[cls]
            return Denial(DenyReason.CONCURRENCY, blocking.id, cls, held, limit, 1)
        tenant_id = self._tenant_of(node)
        queue = self._queues.setdefault(cls, ClassQueue())
        if queue.tenant_len(tenant_id) >= self.config.tenant_queue_max:
            return Denial(DenyReason.QUEUE_FULL, tenant_id, cls)
        waiter = Waiter(self._next_waiter, session.id, node.id, tenant_id, cls, node.priority, tag)
        self._next_waiter += 1
        queue.push(waiter)
        self._waiting[waiter.id] = waiter
        if tag is not None:
            self._pending_rids[(session.id, tag.request_id)] = waiter.id
        return Queued(waiter.id)

    def take_outcome(self, session_id: int, waiter_id: int) -> Granted | Denial | None:
        """What became of a queued acquire: None while it still waits."""
        waiter = self._waiting.get(_ident("waiter_id", waiter_id))
        if waiter is not None:
            if waiter.session_id != session_id:
                raise NotOwner(f"waiter {waiter_id} belongs to another session")
            return None
        known = self._outcomes.get(waiter_id)
        if known is None:
            raise NotFound("waiter_id", f"no waiter {waiter_id}")
        if known[0] != session_id:
            raise NotOwner(f"waiter {waiter_id} belongs to another session")
        del self._outcomes[waiter_id]
        return known[1]

    def cancel_wait(self, session_id: int, waiter_id: int) -> Released | None:
        """Give up a wait. If a grant raced in first, the lease is released and re-dispatched."""
        self._advance()
        waiter = self._waiting.get(_ident("waiter_id", waiter_id))
        if waiter is not None:
            if waiter.session_id != session_id:
                raise NotOwner(f"waiter {waiter_id} belongs to another session")
            self._queues[waiter.cls].remove_where(lambda w: w.id == waiter_id)
            self._forget_waiter(waiter)
            return None
        outcome = self.take_outcome(session_id, waiter_id)
        if isinstance(outcome, Granted) and outcome.lease_id in self._state.leases:
            self._end_lease(outcome.lease_id, LeaseEnd.RELEASED, None, False, None)
            self._dispatch()
            return Released(outcome.lease_id, LeaseEnd.RELEASED, True)
        return None

    def release(
        self,
        session_id: int,
        lease_id: int,
        *,
        latency_ms: int | None = None,
        overloaded: bool = False,
        request_id: str | None = None,
    ) -> Released:
        """End a lease. A second release is a no-op; a lease that ended otherwise says how."""
        self._advance()
        session = self._state.sessions.get(_ident("session_id", session_id))
        if session is None:
            raise NotFound("session_id", f"no session {session_id}")
        if latency_ms is not None:
            _int("latency_ms", latency_ms)
        if not isinstance(overloaded, bool):
            raise InvalidArgument("overloaded", "must be a bool")
        lease = self._state.leases.get(_ident("lease_id", lease_id))
        tomb = self._state.tombstones.get(lease_id)
        if lease is not None:
            owner = lease.session_id
        elif tomb is not None:
            owner = tomb.lease.session_id
        else:
            raise NotFound("lease_id", f"no lease {lease_id} (or its tombstone has been purged)")
        if owner != session_id:
            raise NotOwner(f"lease {lease_id} belongs to another session")
        tag = None
        if session.state is SessionState.OPEN:
            tag, hit = self._recall(session, request_id, ("release", lease_id))
            if hit is not None:
                return hit  # type: ignore[return-value]
        if lease is None:
            assert tomb is not None
            return Released(lease_id, tomb.end, False)
        self._end_lease(lease_id, LeaseEnd.RELEASED, latency_ms, overloaded, tag)
        self._dispatch()
        return Released(lease_id, LeaseEnd.RELEASED, True)

    def validate(self, lease_id: int) -> LeaseStatus:
        """Whether a lease is live now (weaker than fencing by id: it can end right after)."""
        self._advance()
        if _ident("lease_id", lease_id) in self._state.leases:
            return LeaseStatus(lease_id, True, None)
        tomb = self._state.tombstones.get(lease_id)
        if tomb is None:
            raise NotFound("lease_id", f"no lease {lease_id} (or its tombstone has been purged)")
        return LeaseStatus(lease_id, False, tomb.end)

    # ---- internals -----------------------------------------------------------------------

    def _fits(self, node: Node, cls: str) -> Node | None:
        """None if one more lease of ``cls`` fits on the whole chain, else the blocking node."""
        for a in self._state.chain(node.id):
            limit = a.limits.get(cls)
            if limit is not None and a.held.get(cls, 0) >= limit:
                return a
        return None

    def _tenant_of(self, node: Node) -> int:
        cur = node
        while cur.depth > 1:
            assert cur.parent is not None
            cur = self._state.nodes[cur.parent]
        return cur.id

    def _grant(
        self,
        session_id: int,
        node: Node,
        cls: str,
        tag: RequestTag | None,
        waiter_id: int | None,
        now: int,
    ) -> Granted:
        lease_id = self._state.next_id
        self._emit(
            ev.LeaseGranted(self._seq(), now, lease_id, session_id, node.id, cls, tag, waiter_id)
        )
        return Granted(lease_id, node.id, cls)

    def _end_lease(
        self,
        lease_id: int,
        end: LeaseEnd,
        latency_ms: int | None,
        overloaded: bool,
        tag: RequestTag | None,
    ) -> None:
        self._emit(
            ev.LeaseEnded(self._seq(), self._now_ms, lease_id, end, latency_ms, overloaded, tag)
        )

    def _dispatch(self) -> None:
        """Grant queued acquires that now fit, tenants in weighted round robin."""
        root = self._state.nodes[ROOT_ID]
        for cls in sorted(self._queues):
            queue = self._queues[cls]
            while queue.ring:
                if root.limits.get(cls) is not None and root.held.get(cls, 0) >= root.limits[cls]:
                    break
                waiter = queue.pick(
                    lambda w: self._fits(self._state.nodes[w.node_id], w.cls) is None,
                    lambda t, cls=cls: self._tenant_full(t, cls),  # type: ignore[misc]
                )
                if waiter is None:
                    break
                tenant = self._state.nodes[waiter.tenant_id]
                queue.granted(waiter, tenant.weight)
                self._forget_waiter(waiter)
                node = self._state.nodes[waiter.node_id]
                granted = self._grant(
                    waiter.session_id,
                    node,
                    cls,
                    waiter.request,
                    waiter.id,
                    self._now_ms,
                )
                self._set_outcome(waiter, granted)

    def _tenant_full(self, tenant_id: int, cls: str) -> bool:
        """True if the tenant's own limit is full, so none of its waiters can fit."""
        tenant = self._state.nodes[tenant_id]
        limit = tenant.limits.get(cls)
        return limit is not None and tenant.held.get(cls, 0) >= limit

    def _set_outcome(self, waiter: Waiter, outcome: Granted | Denial) -> None:
        self._outcomes[waiter.id] = (waiter.session_id, outcome)
        while len(self._outcomes) > self.config.waiter_outcomes_max:
            self._outcomes.popitem(last=False)

    def _forget_waiter(self, waiter: Waiter) -> None:
        self._waiting.pop(waiter.id, None)
        if waiter.request is not None:
            self._pending_rids.pop((waiter.session_id, waiter.request.request_id), None)

    def _fail_waiters(self, match: set[int], by_session: bool, reason: DenyReason) -> None:
        for cls in sorted(self._queues):
            queue = self._queues[cls]
            gone = queue.remove_where(
                lambda w: (w.session_id if by_session else w.node_id) in match
            )
            for w in gone:
                self._forget_waiter(w)
                self._set_outcome(w, Denial(reason, w.node_id, w.cls))

    def _end_session(self, session: Session, state: SessionState, now: int) -> None:
        end = LeaseEnd.SESSION_EXPIRED if state is SessionState.EXPIRED else LeaseEnd.SESSION_CLOSED
        for lease_id in sorted(session.leases):
            self._end_lease(lease_id, end, None, False, None)
        kind = ev.SessionExpired if state is SessionState.EXPIRED else ev.SessionClosed
        self._emit(kind(self._seq(), now, session.id))
        self._fail_waiters({session.id}, True, DenyReason.SESSION_ENDED)

    def _end_subtree(
        self,
        node: Node,
        state: NodeState,
        session_id: int | None,
        tag: RequestTag | None,
        now: int,
    ) -> None:
        """End ``node`` in ``state``; its live descendants are cancelled, leases end first."""
        order: list[Node] = []
        stack = [node]
        while stack:
            cur = stack.pop()
            order.append(cur)
            for cid in sorted(cur.children, reverse=True):
                child = self._state.nodes[cid]
                if child.state is NodeState.ACTIVE:
                    stack.append(child)
        ids = {n.id for n in order}
        for lease_id in sorted(i for i, ls in self._state.leases.items() if ls.node_id in ids):
            self._end_lease(lease_id, LeaseEnd.NODE_ENDED, None, False, None)
        self._emit(ev.NodeEnded(self._seq(), now, node.id, state, session_id, tag))
        for d in order[1:]:
            self._emit(ev.NodeEnded(self._seq(), now, d.id, NodeState.CANCELLED, None, None))
        self._fail_waiters(ids, False, DenyReason.NODE_ENDED)

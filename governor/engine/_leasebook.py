"""How leases begin and end: grants, the fair queue of waiting acquires, and the endings of
leases, sessions and subtrees that make room in it.

It takes no calls of its own and never reads the clock: the calls (``_leasing``) and the
time-driven work (``_housekeeping``) both drive it, which is why it sits below both.
"""

from __future__ import annotations

from collections import OrderedDict

from . import _events as ev
from ._core import Core
from ._fairq import ClassQueue, Waiter
from ._state import ROOT_ID, Node, Session
from ._types import (
    Denial,
    DenyReason,
    Granted,
    LeaseEnd,
    NodeState,
    RequestTag,
    SessionState,
)

__all__ = ["LeaseBook"]


class LeaseBook:
    """The fair queue per class and what became of the acquires that left it."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self.queues: dict[str, ClassQueue] = {}
        self.waiting: dict[int, Waiter] = {}
        self.pending_rids: dict[tuple[int, str], int] = {}
        self.outcomes: OrderedDict[int, tuple[int, Granted | Denial]] = OrderedDict()
        self._next_waiter = 1

    def queued(self) -> list[Waiter]:
        return [w for q in self.queues.values() for w in q.waiters()]

    def waiting_at(self, node_id: int) -> dict[str, int]:
        """Acquires waiting at ``node_id``, per class (off the hot path: it scans the queues)."""
        waiting: dict[str, int] = {}
        for cls, q in sorted(self.queues.items()):
            n = sum(1 for w in q.waiters() if w.node_id == node_id)
            if n:
                waiting[cls] = n
        return waiting

    def fits(self, node: Node, cls: str) -> Node | None:
        """None if one more lease of ``cls`` fits on the whole chain, else the blocking node."""
        for a in self._core.state.chain(node.id):
            limit = a.limits.get(cls)
            if limit is not None and a.held.get(cls, 0) >= limit:
                return a
        return None

    def tenant_of(self, node: Node) -> int:
        cur = node
        while cur.depth > 1:
            assert cur.parent is not None
            cur = self._core.state.nodes[cur.parent]
        return cur.id

    def enqueue(self, session_id: int, node: Node, cls: str, tag: RequestTag | None) -> int | None:
        """Queue an acquire that does not fit yet; None if its tenant's queue is full."""
        tenant_id = self.tenant_of(node)
        queue = self.queues.setdefault(cls, ClassQueue())
        if queue.tenant_len(tenant_id) >= self._core.config.tenant_queue_max:
            return None
        waiter = Waiter(self._next_waiter, session_id, node.id, tenant_id, cls, node.priority, tag)
        self._next_waiter += 1
        queue.push(waiter)
        self.waiting[waiter.id] = waiter
        if tag is not None:
            self.pending_rids[(session_id, tag.request_id)] = waiter.id
        return waiter.id

    def grant(
        self,
        session_id: int,
        node: Node,
        cls: str,
        tag: RequestTag | None,
        waiter_id: int | None,
        now: int,
    ) -> Granted:
        core = self._core
        lease_id = core.state.next_id
        core.emit(
            ev.LeaseGranted(core.seq(), now, lease_id, session_id, node.id, cls, tag, waiter_id)
        )
        return Granted(lease_id, node.id, cls)

    def end_lease(
        self,
        lease_id: int,
        end: LeaseEnd,
        latency_ms: int | None,
        overloaded: bool,
        tag: RequestTag | None,
    ) -> None:
        core = self._core
        core.emit(
            ev.LeaseEnded(core.seq(), core.now_ms, lease_id, end, latency_ms, overloaded, tag)
        )

    def dispatch(self) -> None:
        """Grant queued acquires that now fit, tenants in weighted round robin."""
        nodes = self._core.state.nodes
        root = nodes[ROOT_ID]
        for cls in sorted(self.queues):
            queue = self.queues[cls]
            while queue.ring:
                if root.limits.get(cls) is not None and root.held.get(cls, 0) >= root.limits[cls]:
                    break
                waiter = queue.pick(
                    lambda w: self.fits(nodes[w.node_id], w.cls) is None,
                    lambda t, cls=cls: self._tenant_full(t, cls),  # type: ignore[misc]
                )
                if waiter is None:
                    break
                tenant = nodes[waiter.tenant_id]
                queue.granted(waiter, tenant.weight)
                self.forget_waiter(waiter)
                node = nodes[waiter.node_id]
                granted = self.grant(
                    waiter.session_id,
                    node,
                    cls,
                    waiter.request,
                    waiter.id,
                    self._core.now_ms,
                )
                self._set_outcome(waiter, granted)

    def _tenant_full(self, tenant_id: int, cls: str) -> bool:
        """True if the tenant's own limit is full, so none of its waiters can fit."""
        tenant = self._core.state.nodes[tenant_id]
        limit = tenant.limits.get(cls)
        return limit is not None and tenant.held.get(cls, 0) >= limit

    def _set_outcome(self, waiter: Waiter, outcome: Granted | Denial) -> None:
        self.outcomes[waiter.id] = (waiter.session_id, outcome)
        while len(self.outcomes) > self._core.config.waiter_outcomes_max:
            self.outcomes.popitem(last=False)

    def forget_waiter(self, waiter: Waiter) -> None:
        self.waiting.pop(waiter.id, None)
        if waiter.request is not None:
            self.pending_rids.pop((waiter.session_id, waiter.request.request_id), None)

    def _fail_waiters(self, match: set[int], by_session: bool, reason: DenyReason) -> None:
        for cls in sorted(self.queues):
            queue = self.queues[cls]
            gone = queue.remove_where(
                lambda w: (w.session_id if by_session else w.node_id) in match
            )
            for w in gone:
                self.forget_waiter(w)
                self._set_outcome(w, Denial(reason, w.node_id, w.cls))

    def end_session(self, session: Session, state: SessionState, now: int) -> None:
        core = self._core
        end = LeaseEnd.SESSION_EXPIRED if state is SessionState.EXPIRED else LeaseEnd.SESSION_CLOSED
        for lease_id in sorted(session.leases):
            self.end_lease(lease_id, end, None, False, None)
        kind = ev.SessionExpired if state is SessionState.EXPIRED else ev.SessionClosed
        core.emit(kind(core.seq(), now, session.id))
        self._fail_waiters({session.id}, True, DenyReason.SESSION_ENDED)

    def end_subtree(
        self,
        node: Node,
        state: NodeState,
        session_id: int | None,
        tag: RequestTag | None,
        now: int,
    ) -> None:
        """End ``node`` in ``state``; its live descendants are cancelled, leases end first."""
        core = self._core
        nodes = core.state.nodes
        order: list[Node] = []
        stack = [node]
        while stack:
            cur = stack.pop()
            order.append(cur)
            for cid in sorted(cur.children, reverse=True):
                child = nodes[cid]
                if child.state is NodeState.ACTIVE:
                    stack.append(child)
        ids = {n.id for n in order}
        for lease_id in sorted(i for i, ls in core.state.leases.items() if ls.node_id in ids):
            self.end_lease(lease_id, LeaseEnd.NODE_ENDED, None, False, None)
        core.emit(ev.NodeEnded(core.seq(), now, node.id, state, session_id, tag))
        for d in order[1:]:
            core.emit(ev.NodeEnded(core.seq(), now, d.id, NodeState.CANCELLED, None, None))
        self._fail_waiters(ids, False, DenyReason.NODE_ENDED)

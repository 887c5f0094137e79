"""The tree: nodes created under a parent, charged with the whole chain, and ended.

A charge is all or nothing: ``consume`` checks every cap on the chain before the one event that
charges them all, in the same step (the driver's lock), so no other call lands in between.
"""

from __future__ import annotations

from . import _events as ev
from ._core import Core, _caps, _int, _name
from ._credit import check_rates
from ._errors import InvalidArgument
from ._housekeeping import Housekeeping
from ._leasebook import LeaseBook
from ._state import ROOT_ID
from ._types import (
    Consumed,
    Created,
    Defaults,
    Denial,
    DenyReason,
    Edited,
    NodeState,
    Rate,
)

__all__ = ["Tree"]


class Tree:
    """The node calls: create, consume, end; and the chain's effective deadline."""

    def __init__(self, core: Core, clock: Housekeeping, leases: LeaseBook) -> None:
        self._core = core
        self._clock = clock
        self._leases = leases

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
        now = self._clock.advance()
        core = self._core
        session = core.caller(session_id)
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
        tag, hit = core.recall(session, request_id, fp)
        if hit is not None:
            return hit  # type: ignore[return-value]
        parent = core.resolve(session, parent_id, edit=False)
        if parent.state is not NodeState.ACTIVE:
            return Denial(DenyReason.NODE_ENDED, parent.id)
        if parent.tenant is not None:  # a tenant itself (a child of the root) is the operator's
            held, most = core.state.tenant_nodes[parent.tenant], core.config.nodes_per_tenant_max
            if held >= most:
                return Denial(DenyReason.NODES, parent.tenant, "nodes", held, most, 1)
        inherited = parent.defaults or Defaults()
        node_id = core.state.next_node_id
        core.emit(
            ev.NodeCreated(
                core.seq(),
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
        self._clock.advance()
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
        now = self._clock.advance()
        core = self._core
        session = core.session(session_id) if session_id is not None else None
        if type(resource) is not str or not 0 < len(resource) <= 256:
            _name("resource", resource)
        if type(amount) is not int or amount < 1:
            _int("amount", amount, 1)
        tag = None
        if request_id is not None:
            tag, hit = core.recall(session, request_id, ("consume", node_id, resource, amount))
            if hit is not None:
                return hit  # type: ignore[return-value]
        chain = core.resolve_chain(session, node_id, edit=False)
        if chain[0].state is not NodeState.ACTIVE:  # live_chain, inlined: the hot path
            return Denial(DenyReason.NODE_ENDED, chain[0].id)
        for a in chain:
            limit = a.quotas.get(resource)
            if limit is not None:
                used = a.used.get(resource, 0)
                if amount > limit - used:
                    top = core.top_consumer(a, resource)
                    return Denial(DenyReason.QUOTA, a.id, resource, used, limit, amount, top)
        core.emit(ev.Charged(core.seq(), now, node_id, resource, amount, session_id, tag))
        return Consumed(node_id, resource, amount)

    def end_node(
        self,
        session_id: int | None,
        node_id: int,
        state: NodeState = NodeState.DONE,
        request_id: str | None = None,
    ) -> Edited:
        """Finish or cancel a node; its live descendants are cancelled and their leases end."""
        now = self._clock.advance()
        core = self._core
        session = core.caller(session_id)
        if state not in (NodeState.DONE, NodeState.CANCELLED):
            raise InvalidArgument("state", "must be DONE or CANCELLED")
        tag, hit = core.recall(session, request_id, ("end", node_id, state.value))
        if hit is not None:
            return hit  # type: ignore[return-value]
        node = core.resolve(session, node_id, edit=True)
        if node.id == ROOT_ID:
            raise InvalidArgument("node_id", "the root cannot end")
        if node.state is NodeState.ACTIVE:
            self._leases.end_subtree(node, state, session_id, tag, now)
            self._leases.dispatch()
        return Edited(node.id)

    def effective_deadline_ms(self, node_id: int) -> int | None:
        """The earliest deadline on the node's chain: a child never outlives its parent."""
        core = self._core
        core.node(node_id)
        found = [n.deadline_ms for n in core.state.chain(node_id) if n.deadline_ms is not None]
        return min(found) if found else None

"""Leases: acquire (now or through the fair queue), release, validate, and waits given up.

Lease ids and session ids come from one counter that only grows, so a larger id is a later grant:
a downstream that remembers the largest id it has seen can fence off a paused worker.
"""

from __future__ import annotations

from ._core import Core, _ident, _int, _name
from ._errors import InvalidArgument, NotFound, NotOwner
from ._housekeeping import Housekeeping
from ._leasebook import LeaseBook
from ._types import (
    Denial,
    DenyReason,
    Granted,
    LeaseEnd,
    LeaseStatus,
    NodeState,
    Queued,
    Released,
    SessionState,
)

__all__ = ["Leasing"]


class Leasing:
    """The lease calls; the grants, the queue and the endings are the lease book's."""

    def __init__(self, core: Core, clock: Housekeeping, book: LeaseBook) -> None:
        self._core = core
        self._clock = clock
        self._book = book

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
        now = self._clock.advance()
        core, book = self._core, self._book
        session = core.session(session_id)
        _name("cls", cls)
        tag, hit = core.recall(session, request_id, ("acquire", node_id, cls))
        if hit is not None:
            return hit  # type: ignore[return-value]
        if tag is not None and (session.id, tag.request_id) in book.pending_rids:
            return Queued(book.pending_rids[(session.id, tag.request_id)])
        node = core.resolve(session, node_id, edit=False)
        if node.state is not NodeState.ACTIVE:
            return Denial(DenyReason.NODE_ENDED, node.id)
        blocking = book.fits(node, cls)
        if blocking is None:
            return book.grant(session.id, node, cls, tag, None, now)
        if not wait:
            held, limit = blocking.held.get(cls, 0), blocking.limits[cls]
            return Denial(DenyReason.CONCURRENCY, blocking.id, cls, held, limit, 1)
        waiter_id = book.enqueue(session.id, node, cls, tag)
        if waiter_id is None:
            return Denial(DenyReason.QUEUE_FULL, book.tenant_of(node), cls)
        return Queued(waiter_id)

    def take_outcome(self, session_id: int, waiter_id: int) -> Granted | Denial | None:
        """What became of a queued acquire: None while it still waits."""
        book = self._book
        waiter = book.waiting.get(_ident("waiter_id", waiter_id))
        if waiter is not None:
            if waiter.session_id != session_id:
                raise NotOwner(f"waiter {waiter_id} belongs to another session")
            return None
        known = book.outcomes.get(waiter_id)
        if known is None:
            raise NotFound("waiter_id", f"no waiter {waiter_id}")
        if known[0] != session_id:
            raise NotOwner(f"waiter {waiter_id} belongs to another session")
        del book.outcomes[waiter_id]
        return known[1]

    def cancel_wait(self, session_id: int, waiter_id: int) -> Released | None:
        """Give up a wait. If a grant raced in first, the lease is released and re-dispatched."""
        self._clock.advance()
        book = self._book
        waiter = book.waiting.get(_ident("waiter_id", waiter_id))
        if waiter is not None:
            if waiter.session_id != session_id:
                raise NotOwner(f"waiter {waiter_id} belongs to another session")
            book.queues[waiter.cls].remove_where(lambda w: w.id == waiter_id)
            book.forget_waiter(waiter)
            return None
        outcome = self.take_outcome(session_id, waiter_id)
        if isinstance(outcome, Granted) and outcome.lease_id in self._core.state.leases:
            book.end_lease(outcome.lease_id, LeaseEnd.RELEASED, None, False, None)
            book.dispatch()
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
        self._clock.advance()
        core = self._core
        session = core.state.sessions.get(_ident("session_id", session_id))
        if session is None:
            raise NotFound("session_id", f"no session {session_id}")
        if latency_ms is not None:
            _int("latency_ms", latency_ms)
        if not isinstance(overloaded, bool):
            raise InvalidArgument("overloaded", "must be a bool")
        lease = core.state.leases.get(_ident("lease_id", lease_id))
        tomb = core.state.tombstones.get(lease_id)
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
            tag, hit = core.recall(session, request_id, ("release", lease_id))
            if hit is not None:
                return hit  # type: ignore[return-value]
        if lease is None:
            assert tomb is not None
            return Released(lease_id, tomb.end, False)
        self._book.end_lease(lease_id, LeaseEnd.RELEASED, latency_ms, overloaded, tag)
        self._book.dispatch()
        return Released(lease_id, LeaseEnd.RELEASED, True)

    def validate(self, lease_id: int) -> LeaseStatus:
        """Whether a lease is live now (weaker than fencing by id: it can end right after)."""
        self._clock.advance()
        state = self._core.state
        if _ident("lease_id", lease_id) in state.leases:
            return LeaseStatus(lease_id, True, None)
        tomb = state.tombstones.get(lease_id)
        if tomb is None:
            raise NotFound("lease_id", f"no lease {lease_id} (or its tombstone has been purged)")
        return LeaseStatus(lease_id, False, tomb.end)

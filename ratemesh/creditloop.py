"""The refill and back-off machine around a worker's credit blocks, with no I/O.

`ratemesh.credit.CreditHolder` holds blocks and spends them; this decides when to ask
governord for more and how long to wait after it said no, and hands back what to give back.
It is the one copy of those rules: the mesh's strict gates (`mesh.core.admission`), the SDK
(`governor.client.StrictCredit`) and the simulator's strict strategy each drive one per
(key, worker), making the calls it returns and telling it the answers.

* Ask when an admission finds too little (`short`): at once, sized for at least what was
  asked, so a large admission is not starved; or ahead of need (`ahead`), at the holder's
  low-water mark. One reserve at a time, never while backing off.
* A partial grant, or an empty bucket's denial (which states the bucket's burst B): the
  bucket is drained. Asking at once would take only what refilled in one round trip, so
  the next ask waits about ``lead_ms`` (`drained_wait_ms`), with no doubling: every worker
  short of credit asks about as often, and the bucket's refill goes to who asks, not to
  whoever was lucky first (a doubling wait left a worker denied a few times out for up to
  500 ms while the others were served). Blocks asked from then on are at most
  ``burst_share_ppm`` of B.
* Any other denial (a cap, too many blocks): wait `denied_backoff_ms`, doubling.
* A reserve that never reached governord: ``governor_unreachable`` from the holder, and
  the next ask waits UNREACHABLE_RETRY_MS.

Times are the caller's monotonic milliseconds; ``instant`` is any clock reading that spreads
the drained wait (`drained_wait_ms`).
"""

from __future__ import annotations

from ratemesh.credit import (
    CreditConfig,
    CreditHolder,
    HeldBlock,
    Reserve,
    denied_backoff_ms,
    drained_wait_ms,
)
from ratemesh.errors import ConfigError

__all__ = ["CreditLoop", "UNREACHABLE_RETRY_MS"]

UNREACHABLE_RETRY_MS = 500  # after a reserve that never reached governord
_BEFORE_ALL = -(2**62)  # an instant earlier than any clock reading


class CreditLoop:
    """One holder and when it may ask next (`retry_at_ms`, the back-off `backoff_ms`)."""

    __slots__ = ("holder", "retry_at_ms", "backoff_ms")

    def __init__(self, config: CreditConfig | None = None) -> None:
        self.holder = CreditHolder(config)
        self.retry_at_ms = _BEFORE_ALL
        self.backoff_ms = 0

    @property
    def config(self) -> CreditConfig:
        return self.holder.config

    # ---- asking --------------------------------------------------------------------------

    def short(self, now_ms: int, units: int) -> Reserve | None:
        """Credit fell short of ``units`` for an admission: the reserve to send now, sized
        for at least ``units``, or None (backing off, one in flight, the holder full)."""
        holder = self.holder
        if now_ms < self.retry_at_ms or holder.in_flight is not None:
            return None
        return holder.begin(now_ms, max(units, holder.block_size(now_ms)))

    def ahead(self, now_ms: int, *, ahead: bool = True) -> Reserve | None:
        """The reserve to send ahead of need, or None (`CreditHolder.refill`; never while
        backing off). ``ahead=False``: an admission just asked (the SDK's hot path)."""
        if now_ms < self.retry_at_ms:
            return None
        return self.holder.refill(now_ms, ahead=ahead)

    def returns(self, now_ms: int, *, leaving: bool = False) -> list[tuple[int, int]]:
        """(block id, unused units) to give back now (`CreditHolder.take_returns`)."""
        return self.holder.take_returns(now_ms, leaving=leaving)

    # ---- answers -------------------------------------------------------------------------

    def granted(
        self,
        now_ms: int,
        request: Reserve,
        block_id: int,
        units: int,
        ttl_ms: int,
        *,
        instant: int,
    ) -> HeldBlock | None:
        """governord granted ``units`` of the ``units`` asked: held until the block's local
        expiry (a block past it is returned whole, `returns`). None: the grant does not fit
        (a bad number, a block already held), nothing is held and the reserve is over. Less
        than asked: the bucket is drained, so the next ask waits (module docstring)."""
        holder = self.holder
        try:
            block = holder.granted(now_ms, request, block_id, units, ttl_ms)
        except ConfigError:
            holder.failed(request, unreachable=False)
            return None
        self.backoff_ms = 0
        if units < request.units:
            self.retry_at_ms = now_ms + drained_wait_ms(holder.drained_wait_base_ms(), instant)
        return block

    def denied(self, now_ms: int, request: Reserve, burst: int | None, *, instant: int) -> None:
        """governord said no. ``burst``: an empty bucket's denial stating its B
        (`ratemesh.credit.rate_burst`); None for any other (module docstring)."""
        self.holder.failed(request, unreachable=False, burst=burst)
        if burst is not None:
            self.backoff_ms = 0
            self.retry_at_ms = now_ms + drained_wait_ms(self.holder.drained_wait_base_ms(), instant)
        else:
            self.backoff_ms = denied_backoff_ms(self.backoff_ms)
            self.retry_at_ms = now_ms + self.backoff_ms

    def unreachable(self, now_ms: int, request: Reserve) -> None:
        """The reserve never reached governord: fail closed, ask again after a while."""
        self.holder.failed(request, unreachable=True)
        self.retry_at_ms = now_ms + UNREACHABLE_RETRY_MS

    def reachable(self, now_ms: int) -> None:
        """governord is back (the driver saw it ready again): a wait after an unreachable
        reserve ends now, so the next ask goes at once. Waits after governord's own answers
        (a drained bucket, a denial) stand."""
        if self.holder.unreachable and self.retry_at_ms > now_ms:
            self.retry_at_ms = now_ms

    def overdue(self, now_ms: int) -> bool:
        """Give up on the reserve in flight if it has gone unanswered for
        ``unreachable_after_ms`` (governord unreachable), so a new one, with a new send time,
        may go at once: a block is timed from its request's first send, so an old request's
        reply would bring little or no life. For a driver that resends a reserve itself
        while it waits (the simulator's lossy network); True if it gave up."""
        holder = self.holder
        request = holder.in_flight
        if request is None or now_ms - request.sent_at_ms < holder.config.unreachable_after_ms:
            return False
        holder.failed(request, unreachable=True)
        return True

    def abandon(self, request: Reserve) -> None:
        """The caller dropped the reserve (its key went away, or the reply was cut short):
        no answer is waited for, and nothing changes when it may ask next."""
        self.holder.failed(request, unreachable=False)

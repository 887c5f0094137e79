"""Credit blocks: a worker reserves k units once and spends them locally with no network call.

``reserve_credit`` grants min(k, what every node of the chain allows): a cap's room and a rated
bucket's whole units. The grant is one event (``CreditGranted``), emitted (so logged) before
the caller hears of it, and it charges the whole chain. ``return_credit`` gives the unused units
of a live block back, once per block id. A block stops counting at ``expires_ms`` on governord's
clock, whatever becomes of its session: the worker, timing the block from when it sent the
request with a margin for clock drift, stops spending before that (docs/strict.md).
"""

from __future__ import annotations

from . import _events as ev
from ._bucket import MILLI, level_at
from ._core import Core, _ident, _int, _name
from ._errors import InvalidArgument
from ._housekeeping import Housekeeping
from ._state import ROOT_ID
from ._types import (
    BlockEnd,
    CreditGrant,
    CreditReturn,
    Denial,
    DenyReason,
    Rate,
)

__all__ = [
    "BLOCK_UNITS_MAX",
    "BURST_MAX",
    "RATE_PER_S_MAX",
    "Credit",
    "check_rate",
    "check_rates",
]

RATE_PER_S_MAX = 10**9  # units per second; keeps the bucket's integers small
BURST_MAX = 10**12
BLOCK_UNITS_MAX = 10**9  # the most one reserve may ask for


def check_rate(field: str, value: object) -> Rate:
    if not isinstance(value, Rate):
        raise InvalidArgument(field, "must be a Rate(per_s, burst)")
    _int(f"{field}.per_s", value.per_s, 0)
    _int(f"{field}.burst", value.burst, 1)
    if value.per_s > RATE_PER_S_MAX:
        raise InvalidArgument(f"{field}.per_s", f"must be <= {RATE_PER_S_MAX}")
    if value.burst > BURST_MAX:
        raise InvalidArgument(f"{field}.burst", f"must be <= {BURST_MAX}")
    return value


def check_rates(field: str, value: object) -> dict[str, Rate]:
    """A node's rates: resource -> Rate, checked; sorted so fingerprints are stable."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be a dict of resource to Rate")
    out = {_name(field, k): check_rate(f"{field}[{k}]", v) for k, v in value.items()}
    return dict(sorted(out.items()))


class Credit:
    """The credit calls: blocks reserved and returned, and the buckets' levels."""

    def __init__(self, core: Core, clock: Housekeeping) -> None:
        self._core = core
        self._clock = clock

    def reserve_credit(
        self,
        session_id: int,
        node_id: int,
        resource: str,
        units: int,
        *,
        request_id: str | None = None,
    ) -> CreditGrant | Denial:
        """A block of up to ``units`` of ``resource`` at ``node_id``, charged to the whole chain;
        fewer if a cap or a bucket on the chain holds fewer, a Denial if one holds none."""
        now = self._clock.advance()
        core = self._core
        session = core.session(session_id)
        _name("resource", resource)
        _int("units", units, 1)
        if units > BLOCK_UNITS_MAX:
            raise InvalidArgument("units", f"must be <= {BLOCK_UNITS_MAX}")
        tag, hit = core.recall(session, request_id, ("credit", node_id, resource, units))
        if hit is not None:
            return hit  # type: ignore[return-value]
        chain = core.live_chain(session, node_id)
        if isinstance(chain, Denial):
            return chain
        node = chain[0]
        cfg, book = core.config, core.state.credit
        mine = len(book.by_session.get(session.id, ()))
        if mine >= cfg.credit_blocks_per_session_max:
            limit = cfg.credit_blocks_per_session_max
            return Denial(DenyReason.CREDIT_BLOCKS, node.id, resource, mine, limit, units)
        if len(book.blocks) >= cfg.credit_blocks_max:
            held = len(book.blocks)
            return Denial(
                DenyReason.CREDIT_BLOCKS, ROOT_ID, resource, held, cfg.credit_blocks_max, units
            )
        grant = units
        for a in chain:
            cap = a.quotas.get(resource)
            if cap is not None:
                used = a.used.get(resource, 0)
                if cap - used < 1:
                    top = core.top_consumer(a, resource)
                    return Denial(DenyReason.QUOTA, a.id, resource, used, cap, units, top)
                grant = min(grant, cap - used)
            bucket = book.buckets.get((a.id, resource))
            if bucket is not None:
                live = sum(1 for _, exp in bucket.blocks.values() if exp > now)
                if live >= cfg.credit_blocks_per_node_max:
                    limit = cfg.credit_blocks_per_node_max
                    return Denial(DenyReason.CREDIT_BLOCKS, a.id, resource, live, limit, units)
                have = level_at(bucket, now) // MILLI
                if have < 1:
                    out = bucket.outstanding(now)
                    return Denial(DenyReason.RATE, a.id, resource, out, bucket.rate.burst, units)
                grant = min(grant, have)
        # a block lives no longer than its session's TTL, nor than an ended node is retained
        # (so a live block's node is never purged, live or in a replay)
        ttl = max(1, min(cfg.credit_ttl_ms, session.ttl_ms, cfg.retention_ms - 1))
        block_id = core.state.next_id
        core.emit(
            ev.CreditGranted(
                core.seq(), now, block_id, session.id, node.id, resource, grant, now + ttl, tag
            )
        )
        return CreditGrant(block_id, node.id, resource, grant, ttl, now + ttl)

    def return_credit(
        self, session_id: int, block_id: int, unused: int, *, request_id: str | None = None
    ) -> CreditReturn:
        """Give back a block's unused units. Applied once per block id: a second return, or
        one after the block expired (its units then stay spent), is a no-op answer; a resend
        under the same ``request_id`` gets the first answer."""
        now = self._clock.advance()
        core = self._core
        session = core.session(session_id)
        _ident("block_id", block_id)
        _int("unused", unused, 0)
        tag, hit = core.recall(session, request_id, ("return", block_id, unused))
        if hit is not None:
            return hit  # type: ignore[return-value]
        block = core.state.credit.blocks.get(block_id)
        if block is None or block.session_id != session.id:
            # Not this session's to return: one that expired and was forgotten, another
            # session's, or no block at all get the same no-op answer, so a return never tells
            # a caller whether an id it does not hold exists.
            return CreditReturn(block_id, unused, False, BlockEnd.EXPIRED)
        if unused > block.units:
            raise InvalidArgument("unused", f"must be <= the block's {block.units} units")
        if block.returned:
            return CreditReturn(block_id, unused, False, BlockEnd.RETURNED)
        if block.node_id not in core.state.nodes:  # purged: credit_ttl_ms < retention_ms
            return CreditReturn(block_id, unused, False, BlockEnd.EXPIRED)
        core.emit(ev.CreditReturned(core.seq(), now, block_id, unused, tag))
        return CreditReturn(block_id, unused, True, BlockEnd.RETURNED)

    def credit_level(self, node_id: int, resource: str) -> tuple[int, int, Rate] | None:
        """(whole units in the bucket now, units outstanding now, its rate); None if unrated.
        For status, metrics and checkers; records nothing."""
        core = self._core
        bucket = core.state.credit.buckets.get((_ident("node_id", node_id), resource))
        if bucket is None:
            return None
        now = max(core.clock.now_ms(), core.now_ms, bucket.at_ms)
        return level_at(bucket, now) // MILLI, bucket.outstanding(now), bucket.rate

    def outstanding_at(self, node_id: int) -> dict[str, int]:
        """Units of unexpired blocks out at ``node_id`` per rated resource (off the hot path:
        it scans the buckets)."""
        now = self._core.now()
        credit = {
            resource: b.outstanding(now)
            for (nid, resource), b in sorted(self._core.state.credit.buckets.items())
            if nid == node_id and b.blocks
        }
        return {k: v for k, v in credit.items() if v}

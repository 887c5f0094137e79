"""The token bucket of a rated quota node: the one place its arithmetic lives.

A rated node (rate R units per second, burst B) keeps ``level + outstanding <= B``: ``level`` is
credit not yet granted, ``outstanding`` the units of blocks granted and still spendable. The
level refills at R while that sum is below B, so credit that is out in a worker's hands earns
nothing. That is the whole strict guarantee on the server side (docs/strict.md): every unit a
worker admits came out of the level once, and the level can gain at most R per second.

Integers only: the level is kept in milliunits, so a millisecond at R units per second refills
exactly R milliunits. A bucket is advanced lazily and purely: ``level_at`` folds the refill and
the expiries of outstanding blocks between the last recorded change and ``now``, so live and
replayed engines compute the same level from the same events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._types import Rate

__all__ = ["MILLI", "Bucket", "level_at"]

MILLI = 1000  # milliunits per unit: one ms at R units/s refills R milliunits


@dataclass(slots=True)
class Bucket:
    """One rated (node, resource). ``blocks`` holds the outstanding blocks charged to it,
    block id -> (units, expires_ms on governord's clock); ``level_mu`` is the level in
    milliunits as of ``at_ms``, the time of the last event that changed it."""

    rate: Rate
    level_mu: int
    at_ms: int
    blocks: dict[int, tuple[int, int]] = field(default_factory=dict)

    def outstanding(self, now_ms: int) -> int:
        """Units of blocks that may still be spent at ``now_ms``."""
        return sum(units for units, expires in self.blocks.values() if expires > now_ms)


def level_at(bucket: Bucket, now_ms: int) -> int:
    """The level in milliunits at ``now_ms`` (>= ``bucket.at_ms``), without changing the bucket.

    Between the last change and ``now_ms`` the level refills at R, capped at B minus what is
    outstanding; each block that expires in between lowers the outstanding (and so raises the
    cap) from its expiry on, never before.
    """
    rate = bucket.rate
    level, t = bucket.level_mu, bucket.at_ms
    if now_ms <= t:
        return level
    live = sorted((expires, units) for units, expires in bucket.blocks.values() if expires > t)
    outstanding = sum(units for _, units in live)
    for expires, units in live:
        if expires > now_ms:
            break
        level = _refill(level, rate, outstanding, expires - t)
        t = expires
        outstanding -= units
    return _refill(level, rate, outstanding, now_ms - t)


def _refill(level_mu: int, rate: Rate, outstanding: int, dt_ms: int) -> int:
    cap = (rate.burst - outstanding) * MILLI
    if level_mu >= cap:
        return level_mu  # a lowered burst takes nothing back; it stops the refill
    return min(cap, level_mu + rate.per_s * dt_ms)

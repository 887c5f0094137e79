"""What a worker and a key's owner say to each other about in-flight slots (global mode).

A worker reports, per scope it holds or wants slots in, its in-flight count, the allowance
it holds and what it wants; the owner answers each report with a grant echoing the report's
sequence number, so a worker adopts only answers to reports it sent, in order, and times the
allowance from when it sent the report (the owner's clock is never read).
"""

from __future__ import annotations

from dataclasses import dataclass

from ratemesh.policy import RateKey

__all__ = ["SlotGrant", "SlotReport", "Scope", "ring_key"]

# (tenant_id, metric): an in-flight cap counts across policy generations, since slots taken
# under the old one are still held when a new one arrives.
Scope = tuple[str, str]


def ring_key(scope: Scope) -> RateKey:
    """Where a scope's owner sits on the ring: one place for every generation."""
    return RateKey(scope[0], scope[1], 0)


@dataclass(frozen=True, slots=True)
class SlotReport:
    """A worker's holdings in one scope as of when it sent this (sequence `seq` within its
    `worker_epoch`, a new process being a new epoch)."""

    scope: Scope
    worker_epoch: int
    seq: int
    in_flight: int
    allowance: int
    want: int


@dataclass(frozen=True, slots=True)
class SlotGrant:
    """The owner's answer to report `seq`: hold at most `allowance` in flight, for
    `lease_ttl_ms` counted from when that report was sent."""

    scope: Scope
    worker_epoch: int
    seq: int
    allowance: int
    lease_ttl_ms: int

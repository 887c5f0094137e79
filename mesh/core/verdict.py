"""The answer to an admission question: a value, never an exception."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mesh.core.policy import Mode

__all__ = ["Reason", "Suspension", "Verdict", "verdict"]


class Reason(StrEnum):
    ADMITTED = "admitted"
    RATE_LIMITED = "rate_limited"  # the limit (or this worker's share of it) is spent
    QUEUE_FULL = "queue_full"  # admit(): the tenant's wait queue is at its bound
    DEADLINE_EXCEEDED = "deadline_exceeded"  # admit(): no capacity before the deadline
    POLICY_UNKNOWN = "policy_unknown"  # no policy generation known: fail closed
    SNAPSHOT_STALE = "snapshot_stale"  # the owner's view expired: stop expanding traffic
    OWNER_UNREACHABLE = "owner_unreachable"
    GOVERNOR_UNREACHABLE = "governor_unreachable"  # strict: governord not answering, nothing held
    GLOBAL_LIMIT = "global_limit"  # strict: the mesh's global view vetoed (no credit touched)
    NO_CREDIT = "no_credit"  # strict: the mesh passed it, no credit held; a refill was asked
    TOO_LARGE = "too_large"  # the amount exceeds the burst: it could never be admitted


class Suspension(StrEnum):
    """Why an answer is degraded. Carried on every verdict given while it lasts."""

    OWNER_UNREACHABLE = "owner_unreachable"
    SNAPSHOT_STALE = "snapshot_stale"
    MEMBERSHIP_STALE = "membership_stale"
    POLICY_UNKNOWN = "policy_unknown"
    GOVERNOR_UNREACHABLE = "governor_unreachable"


@dataclass(frozen=True, slots=True)
class Verdict:
    """allowed or not, why, under which mode, the bound that applied, and any suspension.

    Verdicts are built ahead of time per view and shared, so `try_admit` allocates nothing:
    treat them as immutable values.
    """

    allowed: bool
    reason: Reason
    mode: Mode | None
    bound: str
    suspended: Suspension | None = None

    def __bool__(self) -> bool:
        return self.allowed


_INTERNED: dict[tuple[bool, Reason, Mode | None, str, Suspension | None], Verdict] = {}


def verdict(
    allowed: bool,
    reason: Reason,
    mode: Mode | None,
    bound: str,
    suspended: Suspension | None = None,
) -> Verdict:
    """The shared Verdict for these values: verdicts carry nothing per key, so every view
    in the same condition hands out the same object (no memory per key, no allocation)."""
    key = (allowed, reason, mode, bound, suspended)
    v = _INTERNED.get(key)
    if v is None:
        v = _INTERNED[key] = Verdict(allowed, reason, mode, bound, suspended)
    return v

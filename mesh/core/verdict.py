"""The answer to an admission question: a value, never an exception.

A verdict says allowed or not, why (`reason`), under which mode and `bound`, any
`suspended` degradation, the policy's `limit` and which `step` decided. Those are fixed per
view condition, so the hot path hands out shared, interned verdicts and allocates nothing.
The per-moment numbers (`remaining`, `retry_after_ms`, `reset_after_ms`) are None on the
shared verdicts; the detailed forms (`Admission.try_admit_detailed`, `Mesh.try_admit_detailed`
and the waiting forms) return a fresh verdict with them filled in, each computed by the
view's gate from its own state (`Gate.numbers`). docs/api.md has the field table.

A limit in shadow posture (docs/policies.md) admits every call: its verdicts carry `shadow`,
and one the limit would have denied carries the enforcing reason as `would_deny_reason`
(`shadowed`), with the enforcing mode, bound, suspension and step kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from mesh.core.policy import Mode

__all__ = [
    "NS_PER_MS",
    "Numbers",
    "QuotaLag",
    "Reason",
    "STOPPED",
    "STOPPED_BOUND",
    "Step",
    "Suspension",
    "VERDICTS_INTERNED_MAX",
    "Verdict",
    "ms_ceil",
    "shadowed",
    "verdict",
]

NS_PER_MS = 1_000_000
STOPPED_BOUND = "stopped:nothing_admitted"
# Interned verdicts that carry a limit (one set per distinct target_rate ever seen): past
# this bound `verdict()` builds them fresh instead, so policy churn cannot grow the table
# without end. Verdicts without a limit are a small finite set and always interned.
VERDICTS_INTERNED_MAX = 1 << 16


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
    QUOTA_EXHAUSTED = "quota_exhausted"  # a spend quota: own + remote + amount > cap
    TOO_LARGE = "too_large"  # the amount exceeds the burst: it could never be admitted
    STOPPED = "stopped"  # the node stopped (Mesh.stop / Admission.stop): nothing is admitted
    COOLDOWN = "cooldown"  # a 429 behind this limit: the fleet backs off (docs/cooldown.md)


class Suspension(StrEnum):
    """Why an answer is degraded. Carried on every verdict given while it lasts."""

    OWNER_UNREACHABLE = "owner_unreachable"
    SNAPSHOT_STALE = "snapshot_stale"
    MEMBERSHIP_STALE = "membership_stale"
    POLICY_UNKNOWN = "policy_unknown"
    GOVERNOR_UNREACHABLE = "governor_unreachable"
    REDIS_UNREACHABLE = "redis_unreachable"  # redis mode: the embedded local limiter answered
    COOLDOWN = "cooldown"  # a 429 behind this limit: nothing admitted until it ends


class Step(StrEnum):
    """Which step of admission decided: for a denial, the one that denied."""

    LOCAL = "local"  # this process's GCRA (local mode)
    SHARE = "share"  # this worker's share of the limit (share mode)
    MESH = "mesh"  # the mesh's global view (global mode, and strict's veto)
    STRICT = "strict"  # governord credit (strict mode)
    REDIS = "redis"  # the shared Redis counter's script step (redis mode)
    QUOTA = "quota"  # a spend quota's per-period cap (docs/quotas.md)
    QUEUE = "queue"  # admit(): the tenant's wait queue (full, or the deadline passed)
    POLICY = "policy"  # the policy alone: none known, or disabled
    STOPPED = "stopped"  # the node stopped


class QuotaLag(NamedTuple):
    """What a spend-quota verdict discloses beside its cap (docs/quotas.md): this worker's
    own burn, the peers' burn as last folded (`remote`), the age of that fold (`lag_ms`;
    None: no fold yet) and own burn not yet published (`unpublished`)."""

    cap: int
    own: int
    remote: int
    lag_ms: int | None
    unpublished: int


class Numbers(NamedTuple):
    """A view's per-moment numbers for one amount (`Gate.numbers`). None: not known here
    (`remaining`, `reset_after_ms`) or waiting cannot help (`retry_after_ms`)."""

    remaining: int | None
    retry_after_ms: int | None
    reset_after_ms: int | None


def ms_ceil(ns: int) -> int:
    """Nanoseconds as whole milliseconds, rounded up (a wait never comes out short)."""
    return -(-ns // NS_PER_MS) if ns > 0 else 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """allowed or not, why, under which mode, the bound that applied, and any suspension;
    the policy's limit (units per second) and the step that decided; and, on a detailed
    verdict only, the per-moment numbers (module docstring; docs/api.md).

    Verdicts from `try_admit` are built ahead of time per view and shared, so it allocates
    nothing: treat them as immutable values.
    """

    allowed: bool
    reason: Reason
    mode: Mode | None
    bound: str
    suspended: Suspension | None = None
    limit: int | None = None
    step: Step | None = None
    remaining: int | None = None
    retry_after_ms: int | None = None
    reset_after_ms: int | None = None
    quota: QuotaLag | None = None  # a detailed spend-quota verdict only
    shadow: bool = False  # the limit is in shadow posture: evaluated, counted, admitted
    would_deny_reason: Reason | None = None  # shadow: what enforcing would have answered

    def __bool__(self) -> bool:
        return self.allowed

    def with_numbers(self, n: Numbers, limit: int | None = None) -> Verdict:
        """A fresh, detailed copy of this verdict carrying `n` (and `limit` when this one
        has none: a queue's verdict, filled in from the view)."""
        return Verdict(
            self.allowed,
            self.reason,
            self.mode,
            self.bound,
            self.suspended,
            self.limit if self.limit is not None else limit,
            self.step,
            n.remaining,
            n.retry_after_ms,
            n.reset_after_ms,
            shadow=self.shadow,
            would_deny_reason=self.would_deny_reason,
        )

    def shared(self) -> Verdict:
        """The interned verdict for this one's condition, numbers dropped: what decisions
        are counted under (telemetry counts by `id()` of a shared verdict). Always an
        interned object: past VERDICTS_INTERNED_MAX, the condition without its limit."""
        v = _like(self, self.allowed, self.reason, self.limit, self.would_deny_reason)
        if v.limit is not None and _INTERNED.get(_key(v)) is not v:
            v = _like(self, self.allowed, self.reason, None, self.would_deny_reason)
        return v

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: enum members as their string values, None kept (the API's shape)."""
        out: dict[str, Any] = {
            "allowed": self.allowed,
            "reason": self.reason.value,
            "mode": None if self.mode is None else self.mode.value,
            "bound": self.bound,
            "suspended": None if self.suspended is None else self.suspended.value,
            "limit": self.limit,
            "step": None if self.step is None else self.step.value,
            "remaining": self.remaining,
            "retry_after_ms": self.retry_after_ms,
            "reset_after_ms": self.reset_after_ms,
        }
        if self.quota is not None:  # only on a quota verdict: the API's shape is unchanged
            out["quota"] = self.quota._asdict()
        if self.shadow:  # only under a shadow limit: an enforcing verdict's shape is unchanged
            out["shadow"] = True
            out["would_deny_reason"] = (
                None if self.would_deny_reason is None else self.would_deny_reason.value
            )
        return out


_Key = tuple[
    bool, Reason, Mode | None, str, Suspension | None, int | None, Step | None, bool, Reason | None
]
_INTERNED: dict[_Key, Verdict] = {}
_with_limit = 0  # interned verdicts that carry a limit (bounded by VERDICTS_INTERNED_MAX)


def _key(v: Verdict) -> _Key:
    return (
        v.allowed,
        v.reason,
        v.mode,
        v.bound,
        v.suspended,
        v.limit,
        v.step,
        v.shadow,
        v.would_deny_reason,
    )


def verdict(
    allowed: bool,
    reason: Reason,
    mode: Mode | None,
    bound: str,
    suspended: Suspension | None = None,
    *,
    limit: int | None = None,
    step: Step | None = None,
    shadow: bool = False,
    would_deny: Reason | None = None,
) -> Verdict:
    """The shared Verdict for these values: verdicts carry nothing per key, so every view
    in the same condition hands out the same object (no memory per key, no allocation)."""
    global _with_limit
    key = (allowed, reason, mode, bound, suspended, limit, step, shadow, would_deny)
    v = _INTERNED.get(key)
    if v is None:
        v = Verdict(
            allowed,
            reason,
            mode,
            bound,
            suspended,
            limit,
            step,
            shadow=shadow,
            would_deny_reason=would_deny,
        )
        if limit is None or _with_limit < VERDICTS_INTERNED_MAX:
            _INTERNED[key] = v
            _with_limit += limit is not None
    return v


def shadowed(v: Verdict) -> Verdict:
    """What a shadow limit answers for `v`, the verdict enforcing it gave: admitted, with
    `v`'s reason as `would_deny_reason` when `v` denied (its mode, bound, suspension, limit
    and step kept). Interned like every shared verdict."""
    if v.allowed:
        return _like(v, True, v.reason, v.limit, None, shadow=True)
    return _like(v, True, Reason.ADMITTED, v.limit, v.reason, shadow=True)


def _like(
    v: Verdict,
    allowed: bool,
    reason: Reason,
    limit: int | None,
    would_deny: Reason | None,
    *,
    shadow: bool | None = None,
) -> Verdict:
    """The interned verdict with `v`'s mode, bound, suspension and step (and its `shadow`
    unless given), and these."""
    return verdict(
        allowed,
        reason,
        v.mode,
        v.bound,
        v.suspended,
        limit=limit,
        step=v.step,
        shadow=v.shadow if shadow is None else shadow,
        would_deny=would_deny,
    )


# Every form answers this once the node stopped (`Admission.stop`): waiting cannot help.
STOPPED = verdict(False, Reason.STOPPED, None, STOPPED_BOUND, step=Step.STOPPED)

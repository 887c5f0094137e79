"""Views for the modes that need no owner: local, share, strict, disabled, unknown."""

from __future__ import annotations

from collections.abc import Callable

from mesh.core.gate import NEVER, Gate
from mesh.core.gcra import Gcra
from mesh.core.policy import BOUNDS, TenantRatePolicy
from mesh.core.shares import share_of
from mesh.core.verdict import Reason, Suspension, Verdict

__all__ = ["LocalGate", "FixedGate"]


class LocalGate(Gate):
    """`local` (the whole limit in this process) and `share` (ceil(limit / N_live)).

    A GCRA meter settled at every tick: between ticks `avail` only shrinks, and refill shows
    up at the tick (sync interval). Use since the last settle is charged as of that settle:
    it was admitted from what was available then, and charging it at the later tick would
    lose refill without bound when ticks are sparse. The cost is at most one interval's
    refill (R x tick) of optimism, and only while the bucket sat full.
    """

    __slots__ = ("meter", "n_live", "settled_ns")

    def __init__(
        self, policy: TenantRatePolicy, sink: Callable[[Gate], None], now_ns: int, n_live: int
    ) -> None:
        super().__init__(policy, sink)
        self.n_live = n_live
        self.meter = Gcra(
            share_of(policy.target_rate, n_live), share_of(policy.global_burst, n_live), now_ns
        )
        self.avail = self.meter.burst
        self.settled_ns = now_ns

    def settle(self, now_ns: int) -> bool:
        """Charge what was admitted since the last tick and refill. True if now full."""
        if self.pending:
            self.meter.apply(self.settled_ns, self.pending)
            self.pending = 0
        self.settled_ns = now_ns
        self.denied = 0
        self.avail = self.meter.remaining(now_ns)
        return self.avail >= self.meter.burst

    def resize(self, n_live: int, stale: bool, now_ns: int) -> None:
        """Membership changed (share mode): re-split the limit; stale membership => N=1."""
        self.settle(now_ns)
        self.n_live = 1 if stale else n_live
        p = self.policy
        self.meter.retune(
            share_of(p.target_rate, self.n_live), share_of(p.global_burst, self.n_live), now_ns
        )
        self.avail = self.meter.remaining(now_ns)
        if stale:
            self.set_verdicts(BOUNDS["share_stale"], Suspension.MEMBERSHIP_STALE)
        else:
            self.set_verdicts(BOUNDS["share"])


class FixedGate(Gate):
    """A view whose answer does not depend on usage: disabled, strict without credit,
    global without a mesh, or no policy at all."""

    __slots__ = ()

    def __init__(
        self,
        policy: TenantRatePolicy,
        sink: Callable[[Gate], None],
        allowed: bool,
        bound: str,
        suspended: Suspension | None = None,
        reason: Reason = Reason.RATE_LIMITED,
    ) -> None:
        super().__init__(policy, sink)
        self.flush_at = NEVER
        self.avail = NEVER if allowed else 0
        self.set_verdicts(bound, suspended, reason)
        if allowed:
            self.no = self.ok


def unknown_verdict() -> Verdict:
    return Verdict(False, Reason.POLICY_UNKNOWN, None, BOUNDS["unknown"], Suspension.POLICY_UNKNOWN)

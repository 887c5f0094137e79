"""Views for the modes that need no owner: local and share (`open_local`, `open_share`), and
the fixed answers: disabled, a mode with nothing attached to decide it, unknown."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mesh.core.gate import NEVER, Gate
from mesh.core.gcra import Gcra
from mesh.core.policy import BOUNDS, TenantRatePolicy
from mesh.core.shares import share_of
from mesh.core.verdict import Numbers, Reason, Step, Suspension, Verdict, ms_ceil, verdict

if TYPE_CHECKING:
    from mesh.core.admission._admission import Admission

__all__ = ["LocalGate", "FixedGate", "open_local", "open_share"]


def open_local(admission: Admission, policy: TenantRatePolicy) -> Gate:
    """`local`: the whole limit in this process."""
    v = LocalGate(policy, admission._mark_local, admission._now_ns, 1)
    v.set_verdicts(BOUNDS["local"])
    return v


def open_share(admission: Admission, policy: TenantRatePolicy) -> Gate:
    """`share`: ceil(limit / N_live), re-split whenever membership changes."""
    v = LocalGate(policy, admission._mark_local, admission._now_ns, admission.n_live)
    admission._shares[v] = None
    v.resize(admission.n_live, admission.membership_stale, admission._now_ns)
    return v


class LocalGate(Gate):
    """`local` (the whole limit in this process) and `share` (ceil(limit / N_live)).

    A GCRA meter settled at every tick: between ticks `avail` only shrinks (a refund gives
    back, never past the burst), and refill shows up at the tick (sync interval). The hot
    path has no clock: an admission is taken as made at the core's time, the last tick's
    (`settled_ns`, set when the first use after a settle marks the view, so a view that
    sat full through many ticks is charged at the tick before its use, not at the settle
    that found it full). On that clock the view is exactly a token bucket; on a wall clock
    it runs at most one tick's refill (R x sync interval) ahead (docs/guarantees.md).
    A refund settles what is pending and credits the meter at once, as of the same time
    (the order of admissions and refunds is kept): tokens come back, never past full.
    """

    __slots__ = ("meter", "n_live", "settled_ns", "charged", "largest")

    def __init__(
        self, policy: TenantRatePolicy, sink: Callable[[Gate], None], now_ns: int, n_live: int
    ) -> None:
        super().__init__(policy, sink)
        self.n_live = n_live
        self.meter = Gcra(
            share_of(policy.target_rate, n_live), _burst_share(policy, n_live), now_ns
        )
        burst = self.meter.burst
        self.largest = burst if self.scale == 1 else burst // self.scale
        self.avail = self.largest
        self.settled_ns = now_ns
        self.charged = 0  # units charged to the meter, net of refunds (telemetry reads it)

    def settle(self, now_ns: int) -> bool:
        """Charge what was admitted since the last settle, as of the tick it followed, and
        refill. True if now full."""
        m = self.meter
        if self.pending:
            m.apply(self.settled_ns, self.pending * self.scale)
            self.charged += self.pending
            self.pending = 0
        self.settled_ns = now_ns
        self.denied = 0
        left = m.remaining(now_ns)
        self.avail = left // self.scale
        return left >= m.burst

    def refund(self, amount: int) -> None:
        """Give back `amount` units charged and not used, after what was admitted before it
        (charged now), as of the core's time: the meter never holds more than its burst.
        The view is settled at the next tick, charged as of the last one."""
        if not self.marked:
            self.sink(self)
        m, at, scale = self.meter, self.settled_ns, self.scale
        if self.pending:
            m.apply(at, self.pending * scale)
            self.charged += self.pending
            self.pending = 0
        m.apply(at, -amount * scale)  # below `at` is full: the next charge starts from `at`
        self.charged -= amount
        self.avail = m.remaining(at) // scale

    def idle(self, admission: Admission) -> bool:
        """Full since its last settle (unmarked): forgetting it loses nothing."""
        return not self.marked

    def forget(self, admission: Admission, *, retire: bool) -> None:
        admission._settle.discard(self)
        admission._shares.pop(self, None)

    def resize(self, n_live: int, stale: bool, now_ns: int) -> None:
        """Membership changed (share mode): re-split the limit; stale membership => N=1."""
        self.settle(now_ns)
        self.n_live = 1 if stale else n_live
        p = self.policy
        self.meter.retune(
            share_of(p.target_rate, self.n_live), _burst_share(p, self.n_live), now_ns
        )
        self.largest = self.meter.burst // self.scale
        self.avail = self.meter.remaining(now_ns) // self.scale
        if stale:
            self.set_verdicts(BOUNDS["share_stale"], Suspension.MEMBERSHIP_STALE)
        else:
            self.set_verdicts(BOUNDS["share"])

    def numbers(self, amount: int, allowed: bool, now_ns: int) -> Numbers:
        """From the meter with what was admitted since the last settle charged as `settle`
        will charge it: `remaining` is `avail`; `retry_after_ms` the GCRA's wait for
        `amount` (None past this view's burst, a share smaller than the amount);
        `reset_after_ms` until the meter is full. Refill shows up at the next tick, so a
        denial whose refill is already due says 1 ms."""
        m, scale = self.meter, self.scale
        at = now_ns if now_ns > self.settled_ns else self.settled_ns
        need = amount * scale
        wait, ahead = m.forecast(self.settled_ns, self.pending * scale, at, min(need, m.burst))
        retry: int | None = 0
        if not allowed:
            retry = None if need > m.burst else max(1, ms_ceil(wait))
        return Numbers(max(self.avail, 0), retry, ms_ceil(ahead))


def _burst_share(policy: TenantRatePolicy, n_live: int) -> int:
    """ceil(B / N) in whole units, in sub-units (`Gate`): a share can always take a unit,
    as it can with scale 1 (where this is share_of(B, N))."""
    return share_of(policy.burst_units, n_live) * policy.scale


class FixedGate(Gate):
    """A view whose answer does not depend on usage: disabled, strict without credit,
    global without a mesh, or no policy at all."""

    __slots__ = ("largest",)

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
        self.largest = NEVER if allowed else policy.burst_units
        if allowed:  # disabled: no limit applies, and the policy alone decided
            self.set_verdicts(bound, suspended, reason, limited=False, step=Step.POLICY)
            self.no = self.ok
        else:
            self.set_verdicts(bound, suspended, reason)

    def deny(self, amount: int, admission: Admission) -> Verdict:
        """Shut: nothing is metered here, so nothing is counted."""
        return self.no

    def idle(self, admission: Admission) -> bool:
        return True  # nothing here moves: rebuilt the same

    def numbers(self, amount: int, allowed: bool, now_ns: int) -> Numbers:
        """Unlimited (remaining None) or shut until the configuration changes (remaining 0,
        waiting cannot help): nothing here moves with time."""
        return Numbers(None, 0, None) if allowed else Numbers(0, None, None)


def unknown_verdict() -> Verdict:
    return verdict(
        False,
        Reason.POLICY_UNKNOWN,
        None,
        BOUNDS["unknown"],
        Suspension.POLICY_UNKNOWN,
        step=Step.POLICY,
    )

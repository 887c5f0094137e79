"""GCRA (generic cell rate algorithm) in exact integer arithmetic.

Time is integer nanoseconds. To keep the emission interval T = 1/R exact for any integer
rate, every instant is scaled by R: a scaled instant is `t_ns * R`, one unit's emission
interval is then exactly 1e9 scaled ticks, and the burst tolerance tau = B * 1e9. Python
ints do not overflow, so a meter runs for years without drift.

The owner applies usage *after the fact* (`apply`): reports describe work already done, so
the theoretical arrival time (TAT) may run past the tolerance, and `remaining` stays 0 until
the debt is paid back at R. `try_take` is the conditional form for local decisions.
"""

from __future__ import annotations

from mesh.core._validate import check_int
from mesh.errors import ConfigError

__all__ = ["Gcra", "NS_PER_S", "RECOVERED_PART", "recovered", "refill_ns"]

NS_PER_S = 1_000_000_000
# An exhausted meter counts as recovered once 1/RECOVERED_PART of its burst is back.
RECOVERED_PART = 8


def recovered(remaining: int, burst: int) -> bool:
    """Whether a meter that ran dry is no longer exhausted, with `remaining` of `burst`
    left. Hysteresis: under steady overload the bucket hovers near zero, and an owner that
    broadcast exhaustion at every brush with it would make traffic grow with load."""
    return remaining * RECOVERED_PART >= burst


def refill_ns(units: int, rate: int) -> int:
    """Nanoseconds a meter at `rate` units/s takes to refill `units` (rounded up): `units`
    emission intervals of 1e9 / R ns. A global view's wait estimate (GlobalGate.numbers)."""
    return -(-max(units, 0) * NS_PER_S // rate)


class Gcra:
    """One meter: rate R units/s, burst B units. State is a single integer, the TAT."""

    __slots__ = ("rate", "burst", "_tau", "_tat")

    def __init__(self, rate: int, burst: int, now_ns: int, *, exhausted: bool = False) -> None:
        check_int("rate", rate, minimum=1)
        check_int("burst", burst, minimum=1)
        check_int("now_ns", now_ns, minimum=0)
        self.rate = rate
        self.burst = burst
        self._tau = burst * NS_PER_S
        # Full: TAT at (or before) now. Exhausted: TAT a whole tolerance ahead, so the
        # bucket refills from zero at R - a new owner's conservative start (seed 004).
        self._tat = now_ns * rate + (self._tau if exhausted else 0)

    @property
    def tat_scaled(self) -> int:
        """The TAT in scaled ticks (ns * R); exposed for checkers and snapshots of state."""
        return self._tat

    def remaining(self, now_ns: int) -> int:
        """Whole units that could be taken at `now_ns`, in [0, B]."""
        free = now_ns * self.rate + self._tau - self._tat
        if free <= 0:
            return 0
        units = free // NS_PER_S
        return self.burst if units > self.burst else units

    def apply(self, now_ns: int, amount: int) -> None:
        """Record usage that already happened, even past the limit (it becomes debt)."""
        now_s = now_ns * self.rate
        self._tat = (self._tat if self._tat > now_s else now_s) + amount * NS_PER_S

    def try_take(self, now_ns: int, amount: int) -> bool:
        """Take `amount` if it conforms; otherwise change nothing and return False."""
        now_s = now_ns * self.rate
        new_tat = (self._tat if self._tat > now_s else now_s) + amount * NS_PER_S
        if new_tat - now_s > self._tau:
            return False
        self._tat = new_tat
        return True

    def wait_ns(self, now_ns: int, amount: int) -> int:
        """Nanoseconds until `amount` would conform (0 if it does now)."""
        if amount > self.burst:
            raise ConfigError("amount", f"{amount} can never conform to burst {self.burst}")
        return self._wait(self._tat, now_ns * self.rate, amount)

    def _wait(self, tat: int, now_s: int, amount: int) -> int:
        excess = (tat if tat > now_s else now_s) + amount * NS_PER_S - now_s - self._tau
        if excess <= 0:
            return 0
        return -(-excess // self.rate)

    def forecast(self, used_at_ns: int, used: int, now_ns: int, amount: int) -> tuple[int, int]:
        """(`wait_ns(now_ns, amount)`, `ahead_ns(now_ns)`) as they would be after
        `apply(used_at_ns, used)`, without changing this meter or copying it (a view's
        numbers, asked on every detailed verdict). `amount` must be within the burst."""
        tat = self._tat
        if used:  # apply's arithmetic, on a local
            at_s = used_at_ns * self.rate
            tat = (tat if tat > at_s else at_s) + used * NS_PER_S
        now_s = now_ns * self.rate
        return self._wait(tat, now_s, amount), self._ahead(tat, now_s)

    def copy(self) -> Gcra:
        """An independent meter in the same state (to ask what-if questions of)."""
        m = Gcra.__new__(Gcra)
        m.rate, m.burst, m._tau, m._tat = self.rate, self.burst, self._tau, self._tat
        return m

    def retune(self, rate: int, burst: int, now_ns: int) -> None:
        """Change R and B keeping the current debt/credit in units (policy change)."""
        check_int("rate", rate, minimum=1)
        check_int("burst", burst, minimum=1)
        now_s = now_ns * self.rate
        used_units_scaled = max(self._tat - now_s, 0)  # units * 1e9 not yet drained
        self.rate, self.burst, self._tau = rate, burst, burst * NS_PER_S
        self._tat = now_ns * rate + used_units_scaled

    def ahead_ns(self, now_ns: int) -> int:
        """How far the TAT is ahead of `now_ns`, in ns rounded up (0: full). The meter's
        state without an absolute time: another process resumes it with `hold`."""
        return self._ahead(self._tat, now_ns * self.rate)

    def _ahead(self, tat: int, now_s: int) -> int:
        ahead = tat - now_s
        return -(-ahead // self.rate) if ahead > 0 else 0

    def hold(self, now_ns: int, ahead_ns: int) -> None:
        """Keep the TAT at least `ahead_ns` past `now_ns`. It only ever tightens the meter,
        so a late or repeated hand-over cannot loosen it."""
        tat = (now_ns + ahead_ns) * self.rate
        if tat > self._tat:
            self._tat = tat

    def __repr__(self) -> str:
        return f"Gcra(rate={self.rate}, burst={self.burst}, tat_scaled={self._tat})"

"""A checker of the global mode's fleet envelope, written apart from the code it checks.

It reads a recorded history (each admission's instant at the caller and its units) and
knows nothing of the mesh: not its telemetry, not its shares, not its own excess helpers.

* `worst_interval`: the largest `units admitted in [t_i, t_j] - R * (t_j - t_i)` over every
  interval whose ends are admissions (the supremum over all intervals is reached there),
  in O(n) after the sort: for an end j the best start i maximises `R*t_i - P(i-1)`, a
  running maximum. Integer arithmetic in nanoseconds, so no rounding decides a verdict.
* `IdealBucket`: one exact token bucket (capacity B, rate R) fed the admitted history, the
  yardstick of the starvation check: how many tokens an ideal limiter would hold at t.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Admission", "Worst", "worst_interval", "violations", "IdealBucket", "NS"]

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Admission:
    t_ns: int  # time.monotonic_ns at the caller
    units: int
    where: str = ""  # the member that admitted it (for the message only)


@dataclass(frozen=True, slots=True)
class Worst:
    """The interval with the largest lead of admissions over `R * length`."""

    excess: float  # units admitted in [start, end] - R * (end - start)
    start_ns: int
    end_ns: int
    units: int  # admitted in [start, end]
    count: int  # admissions in it

    def explain(self, t0_ns: int = 0) -> str:
        return (
            f"{self.units} units in {self.count} admissions over "
            f"[{(self.start_ns - t0_ns) / 1e9:.3f} s, {(self.end_ns - t0_ns) / 1e9:.3f} s] "
            f"({(self.end_ns - self.start_ns) / 1e6:.1f} ms): excess {self.excess:.2f}"
        )


def _sorted(history: Iterable[Admission]) -> list[Admission]:
    return sorted(history, key=lambda a: a.t_ns)


def _leads(adm: list[Admission], rate: int) -> list[tuple[int, int]]:
    """Per end j: (the largest `1e9 * units(i..j) - rate * (t_j - t_i)` over i <= j, the i)."""
    out: list[tuple[int, int]] = []
    best, best_i = -(1 << 200), 0  # max over i of rate*t_i - 1e9*P(i-1)
    before = 0  # 1e9 * units admitted before j
    for j, a in enumerate(adm):
        cand = rate * a.t_ns - before
        if cand >= best:
            best, best_i = cand, j
        before += a.units * NS
        out.append((before - rate * a.t_ns + best, best_i))
    return out


def worst_interval(history: Iterable[Admission], rate: int) -> Worst | None:
    """The interval of the history with the largest excess over `rate` (units per second,
    an integer); None for an empty history."""
    adm = _sorted(history)
    if not adm:
        return None
    leads = _leads(adm, rate)
    j = max(range(len(adm)), key=lambda k: leads[k][0])
    lead, i = leads[j]
    return Worst(
        excess=lead / NS,
        start_ns=adm[i].t_ns,
        end_ns=adm[j].t_ns,
        units=sum(a.units for a in adm[i : j + 1]),
        count=j - i + 1,
    )


def violations(history: Iterable[Admission], rate: int, allowed: float) -> int:
    """How many admissions end an interval whose excess is above `allowed` (B + the bound):
    0 means the envelope held over every interval."""
    adm = _sorted(history)
    limit = allowed * NS
    return sum(1 for lead, _ in _leads(adm, rate) if lead > limit)


class IdealBucket:
    """An exact token bucket, capacity `burst`, refilled at `rate` per second from `level0`
    at `t0_ns`, spent by every recorded admission (it may go negative: the mesh is allowed
    to run ahead of it, within its envelope). `level(t)` is its tokens at t, after every
    admission at or before t."""

    def __init__(
        self, history: Iterable[Admission], rate: int, burst: int, t0_ns: int, level0: float = 0
    ) -> None:
        self.rate, self.burst = rate, burst
        self.times: list[int] = [t0_ns]
        self.after: list[float] = [float(level0)]  # level just after each admission
        level, last = float(level0), t0_ns
        for a in _sorted(history):
            if a.t_ns < t0_ns:
                continue
            level = min(float(burst), level + rate * (a.t_ns - last) / NS) - a.units
            last = a.t_ns
            self.times.append(a.t_ns)
            self.after.append(level)

    def level(self, t_ns: int) -> float:
        k = bisect.bisect_right(self.times, t_ns) - 1
        if k < 0:
            return 0.0
        return min(float(self.burst), self.after[k] + self.rate * (t_ns - self.times[k]) / NS)

    def least(self, start_ns: int, end_ns: int) -> float:
        """The fewest tokens it held at any instant of [start, end]: at the start, or just
        after an admission inside (between admissions it only refills)."""
        lo = self.level(start_ns)
        k = bisect.bisect_right(self.times, start_ns)
        while k < len(self.times) and self.times[k] <= end_ns:
            lo = min(lo, self.after[k])
            k += 1
        return lo

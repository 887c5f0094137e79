"""A checker of the global mode's fleet envelope, written apart from the code it checks.

It reads a recorded history and knows nothing of the mesh: not its telemetry, not its
shares, not its own excess helpers. An admission is known to have happened at some instant
in `[lo_ns, hi_ns]`: the caller's clock before its call and after the answer (an embedded
caller that reads the clock right after `try_admit` may give one instant for both).

* `worst_interval`: the largest `units - R * (y - x)` over every interval [x, y] and the
  admissions that surely fell inside it (`lo >= x` and `hi <= y`). No interval of the true
  history can be checked more tightly without knowing more, and no real violation is
  missed for an admission timed to within its own call. Exact times reduce it to the usual
  measure over every interval. A sweep over the ends y (ascending `hi`) with a segment tree
  over the starts x (range add, prefix max): O(n log n), integers in nanoseconds, so no
  rounding decides a verdict.
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
    hi_ns: int  # at or before this instant (the answer)
    units: int
    lo_ns: int | None = None  # at or after this one (the ask); None: exactly at hi_ns
    where: str = ""  # the member that admitted it (for the message only)

    @property
    def start_ns(self) -> int:
        return self.hi_ns if self.lo_ns is None else self.lo_ns


@dataclass(frozen=True, slots=True)
class Worst:
    """The interval with the largest lead of (surely contained) admissions over R * length."""

    excess: float  # units surely admitted in [start, end] - R * (end - start)
    start_ns: int
    end_ns: int
    units: int
    count: int  # admissions surely in it

    def explain(self, t0_ns: int = 0) -> str:
        return (
            f"{self.units} units in {self.count} admissions over "
            f"[{(self.start_ns - t0_ns) / 1e9:.3f} s, {(self.end_ns - t0_ns) / 1e9:.3f} s] "
            f"({(self.end_ns - self.start_ns) / 1e6:.1f} ms): excess {self.excess:.2f}"
        )


class _MaxTree:
    """Range add on a prefix, max (with its index) on a prefix, over fixed leaves."""

    def __init__(self, leaves: list[int]) -> None:
        self.n = n = len(leaves)
        size = 1
        while size < n:
            size *= 2
        self.size = size
        neg = -(1 << 256)
        self.best = [neg] * (2 * size)
        self.arg = [0] * (2 * size)
        self.add = [0] * (2 * size)
        for i, v in enumerate(leaves):
            self.best[size + i], self.arg[size + i] = v, i
        for k in range(size - 1, 0, -1):
            self._pull(k)

    def _pull(self, k: int) -> None:
        a, b = 2 * k, 2 * k + 1
        j = a if self.best[a] >= self.best[b] else b
        self.best[k], self.arg[k] = self.best[j] + self.add[k], self.arg[j]

    def add_prefix(self, last: int, delta: int, k: int = 1, lo: int = 0, hi: int = -1) -> None:
        """Add delta to leaves 0..last."""
        if hi < 0:
            hi = self.size - 1
        if lo > last:
            return
        if hi <= last:
            self.best[k] += delta
            self.add[k] += delta
            return
        mid = (lo + hi) // 2
        self.add_prefix(last, delta, 2 * k, lo, mid)
        self.add_prefix(last, delta, 2 * k + 1, mid + 1, hi)
        self._pull(k)

    def max_prefix(self, last: int, k: int = 1, lo: int = 0, hi: int = -1) -> tuple[int, int]:
        """(the largest leaf value among 0..last, its index)."""
        if hi < 0:
            hi = self.size - 1
        if hi <= last:
            return self.best[k], self.arg[k]
        mid = (lo + hi) // 2
        left = self.max_prefix(last, 2 * k, lo, mid)
        if mid + 1 > last:
            return left[0] + self.add[k], left[1]
        right = self.max_prefix(last, 2 * k + 1, mid + 1, hi)
        best = left if left[0] >= right[0] else right
        return best[0] + self.add[k], best[1]


def _leads(history: Iterable[Admission], rate: int) -> list[tuple[int, int, int]]:
    """Per end y (each admission's hi, ascending): (the largest `1e9 * units surely in
    [x, y] - rate * (y - x)` over starts x <= y, that x, y)."""
    adm = sorted(history, key=lambda a: a.hi_ns)
    if not adm:
        return []
    xs = sorted({a.start_ns for a in adm})
    tree = _MaxTree([rate * x for x in xs])
    out = []
    for a in adm:
        # every start x <= a's own start now sees a's units
        tree.add_prefix(bisect.bisect_right(xs, a.start_ns) - 1, a.units * NS)
        lead, i = tree.max_prefix(bisect.bisect_right(xs, a.hi_ns) - 1)
        out.append((lead - rate * a.hi_ns, xs[i], a.hi_ns))
    return out


def worst_interval(history: Iterable[Admission], rate: int) -> Worst | None:
    """The interval of the history with the largest excess over `rate` (units per second,
    an integer); None for an empty history."""
    history = list(history)
    leads = _leads(history, rate)
    if not leads:
        return None
    lead, x, y = max(leads, key=lambda t: t[0])
    inside = [a for a in history if a.start_ns >= x and a.hi_ns <= y]
    return Worst(
        excess=lead / NS,
        start_ns=x,
        end_ns=y,
        units=sum(a.units for a in inside),
        count=len(inside),
    )


def violations(history: Iterable[Admission], rate: int, allowed: float) -> int:
    """How many admissions end an interval whose excess is above `allowed` (B + the bound):
    0 means the envelope held over every interval."""
    limit = allowed * NS
    return sum(1 for lead, _, _ in _leads(history, rate) if lead > limit)


class IdealBucket:
    """An exact token bucket, capacity `burst`, refilled at `rate` per second from `level0`
    at `t0_ns`, spent by every recorded admission at its earliest instant (`start_ns`; it
    may go negative: the mesh is allowed to run ahead of it, within its envelope).
    `level(t)` is its tokens at t, after every admission at or before t."""

    def __init__(
        self, history: Iterable[Admission], rate: int, burst: int, t0_ns: int, level0: float = 0
    ) -> None:
        self.rate, self.burst = rate, burst
        self.times: list[int] = [t0_ns]
        self.after: list[float] = [float(level0)]  # level just after each admission
        level, last = float(level0), t0_ns
        for a in sorted(history, key=lambda a: a.start_ns):
            if a.start_ns < t0_ns:
                continue
            level = min(float(burst), level + rate * (a.start_ns - last) / NS) - a.units
            last = a.start_ns
            self.times.append(a.start_ns)
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

"""Reference limiters and envelope checks, written apart from the cores they judge.

A guarantee counts only when something that shares no code with the implementation checks
it: nothing here imports `mesh.core` (its GCRA, shares or verdicts). The model tests
(tests/mesh/core/test_model_*.py, tests/mesh/testing/test_model_fleet.py) feed the cores
adversarial schedules and hold every admission they make against these:

* `TokenBucket`: the textbook bucket, in exact integers (units x 1e9, refilled at R per
  second, never past B). `replay` feeds it a recorded history of admissions and refunds;
  a history conforms when the level never goes below zero (`local`, a `share` member).
* `envelope_excess`: over every interval [t_i, t_j] of a history, how far the units
  admitted exceed R * (t_j - t_i) + B (the fleet envelope of `global` adds N*b + R*d to
  B; `strict` holds it with nothing added).

docs/guarantees.md names each mode's model and what it is checked under.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fractions import Fraction

__all__ = ["TokenBucket", "replay", "envelope_excess", "NS_PER_S"]

NS_PER_S = 1_000_000_000


class TokenBucket:
    """Tokens refill continuously at `rate` units/s up to `burst`; an admission takes its
    amount. The level is kept in units x 1e9 so that every refill is an exact integer."""

    __slots__ = ("rate", "burst", "level", "at_ns")

    def __init__(self, rate: int, burst: int, now_ns: int = 0) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"rate and burst must be positive, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self.level = burst * NS_PER_S  # starts full
        self.at_ns = now_ns

    def _refill(self, now_ns: int) -> None:
        if now_ns > self.at_ns:
            self.level = min(self.burst * NS_PER_S, self.level + self.rate * (now_ns - self.at_ns))
            self.at_ns = now_ns

    def tokens(self, now_ns: int) -> Fraction:
        """The level at `now_ns`, in units (may be negative after `force`)."""
        self._refill(now_ns)
        return Fraction(self.level, NS_PER_S)

    def take(self, now_ns: int, amount: int) -> bool:
        """Take `amount` if the bucket holds it."""
        self._refill(now_ns)
        if self.level < amount * NS_PER_S:
            return False
        self.level -= amount * NS_PER_S
        return True

    def force(self, now_ns: int, amount: int) -> None:
        """Take `amount` whatever the level (an admission made elsewhere, to be judged)."""
        self._refill(now_ns)
        self.level -= amount * NS_PER_S

    def give(self, now_ns: int, amount: int) -> None:
        """A refund: `amount` tokens back, never past full."""
        self._refill(now_ns)
        self.level = min(self.burst * NS_PER_S, self.level + amount * NS_PER_S)


def replay(
    history: Iterable[tuple[int, int]], rate: int, burst: int, start_ns: int = 0
) -> Fraction:
    """Feed a history of (time ns, units) in time order to a full `TokenBucket` (units > 0
    admitted, < 0 refunded) and return its lowest level, in units: >= 0 when every
    admission conformed, -x when the history took x more than the bucket held."""
    bucket = TokenBucket(rate, burst, start_ns)
    low = Fraction(burst)
    for t, units in history:
        if units >= 0:
            bucket.force(t, units)
            level = Fraction(bucket.level, NS_PER_S)
            if level < low:
                low = level
        else:
            bucket.give(t, -units)
    return low


def envelope_excess(
    times_ns: Sequence[int], amounts: Sequence[int], rate: int, burst: float
) -> float:
    """max over i <= j of sum(amounts[i..j]) - rate * (t_j - t_i) / 1e9 - burst, for times
    in order: > 0 when some interval admitted more than R * span + `burst`. -inf for none.

    Exact in integers (units x 1e9) up to the final division: an interval ending at j is
    worst started at the i <= j with the largest rate * t_i - 1e9 * (units before i)."""
    if len(times_ns) != len(amounts):
        raise ValueError(f"{len(times_ns)} times but {len(amounts)} amounts")
    best = None
    start = None  # max over i <= j of rate * t_i - NS * before_i
    before = 0
    last = None
    for t, a in zip(times_ns, amounts, strict=True):
        if last is not None and t < last:
            raise ValueError(f"times must be in order: {t} after {last}")
        last = t
        here = rate * t - NS_PER_S * before
        if start is None or here > start:
            start = here
        before += a
        lead = NS_PER_S * before - rate * t + start  # units in [t_i, t_j], less R * span
        if best is None or lead > best:
            best = lead
    if best is None:
        return float("-inf")
    return best / NS_PER_S - burst

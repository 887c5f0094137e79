"""Checking a recorded history against the envelope, from outside the system."""

from __future__ import annotations

__all__ = ["excess_over_windows"]


def excess_over_windows(buckets: list[int], rate: float, burst: int, bucket_s: float) -> float:
    """The largest lead of admissions over what an exact limiter could admit in any window
    of whole buckets: max over [i, j) of admitted - (B + R * span). Counting whole buckets
    never makes a conforming history look excessive."""
    prefix = [0]
    for b in buckets:
        prefix.append(prefix[-1] + b)
    worst = float("-inf")
    n = len(buckets)
    for i in range(n):
        base = prefix[i]
        for j in range(i + 1, n + 1):
            e = prefix[j] - base - (burst + rate * (j - i) * bucket_s)
            if e > worst:
                worst = e
    return worst

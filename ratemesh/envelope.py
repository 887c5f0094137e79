"""Checking a recorded history against the envelope, from outside the system.

Both scans are one pass (a maximum-subarray scan): the worst interval of a long run is
found in time linear in the run, so a checker can judge every interval of every run. The
mesh's telemetry and the strict mode's checkers (tree of rated, capped nodes) share them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "Admission",
    "cap_excess",
    "excess_over_times",
    "excess_over_windows",
    "rate_excess",
]

Admission = tuple[int, int, int]  # (time in ns, node id, units): one recorded admission

NS_PER_S = 1_000_000_000


def excess_over_windows(buckets: list[int], rate: float, burst: int, bucket_s: float) -> float:
    """The largest lead of admissions over what an exact limiter could admit in any window
    of whole buckets: max over [i, j) of admitted - (B + R * span). Counting whole buckets
    never makes a conforming history look excessive. -inf for no buckets.

    Kadane's scan over the buckets' leads (admitted - R * bucket_s): the best window ending
    at a bucket either extends the best one ending at the bucket before or starts anew."""
    step = rate * bucket_s
    worst = float("-inf")
    ending = float("-inf")
    for b in buckets:
        lead = b - step
        ending = lead if ending < 0 else ending + lead
        if ending > worst:
            worst = ending
    return worst - burst


def excess_over_times(
    times_ns: Sequence[int], amounts: Sequence[int], rate: float, burst: int
) -> float:
    """The largest excess of exact admission times over the strict guarantee:
    max over i <= j of (sum of amounts[i..j]) - R * (t_j - t_i) - B, the admissions in the
    closed interval [t_i, t_j] against what `admitted <= R * (t1 - t0) + B` allows. Times
    must be in order (ties allowed). <= 0 means the history keeps the guarantee over every
    interval; -inf for no admissions.

    One pass: an interval ending at j is best started at the i <= j that maximises
    R * t_i - (units admitted before i), kept as a running maximum."""
    if len(times_ns) != len(amounts):
        raise ValueError(
            f"times_ns and amounts differ in length: {len(times_ns)} != {len(amounts)}"
        )
    per_ns = rate / NS_PER_S
    before = 0  # units admitted before the current one
    best_start = float("-inf")  # max over i <= j of R * t_i - before_i
    worst = float("-inf")
    last = None
    for t, a in zip(times_ns, amounts, strict=True):
        if last is not None and t < last:
            raise ValueError(f"times_ns must be in order: {t} after {last}")
        last = t
        start = per_ns * t - before
        if start > best_start:
            best_start = start
        before += a
        e = before - per_ns * t + best_start
        if e > worst:
            worst = e
    return worst - burst


def _subtree_units(
    admissions: Iterable[Admission], parent_of: Mapping[int, int | None], nodes: set[int]
) -> dict[int, list[tuple[int, int]]]:
    """For each node of ``nodes``: (time, units) of the admissions at it or below it."""
    out: dict[int, list[tuple[int, int]]] = {n: [] for n in nodes}
    for t, node, units in admissions:
        cur: int | None = node
        seen = 0
        while cur is not None:
            if cur in out:
                out[cur].append((t, units))
            cur = parent_of.get(cur)
            seen += 1
            if seen > len(parent_of) + 1:
                raise ValueError(f"parent_of: node {node}'s ancestry has a cycle")
    return out


def rate_excess(
    admissions: Iterable[Admission],
    parent_of: Mapping[int, int | None],
    rates: Mapping[int, tuple[float, int]],
) -> dict[int, float]:
    """For each rated node q (rate R units/s, burst B): the largest
    ``admitted_q(t0, t1) - R * (t1 - t0) - B`` over every interval, counting admissions at q
    and below it. Every value <= 0 means the strict guarantee held; -inf for no admissions."""
    by_node = _subtree_units(admissions, parent_of, set(rates))
    out = {}
    for node in sorted(by_node):
        items = sorted(by_node[node])
        rate, burst = rates[node]
        out[node] = excess_over_times([t for t, _ in items], [u for _, u in items], rate, burst)
    return out


def cap_excess(
    admissions: Iterable[Admission],
    parent_of: Mapping[int, int | None],
    caps: Mapping[int, int],
) -> dict[int, int]:
    """For each capped node: units admitted at it and below it, minus its cap (<= 0: held)."""
    by_node = _subtree_units(admissions, parent_of, set(caps))
    return {n: sum(u for _, u in by_node[n]) - caps[n] for n in sorted(by_node)}

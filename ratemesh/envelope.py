"""The envelope the global mode promises, `excess <= N*b + R*d`, in one place.

* `excess_bound`: the formula N*b + R*d (N members, b the local burst cap, R the rate, d the
  propagation delay). /health, telemetry, the demo, the benchmarks and the simulator call it.
* `d_estimate_ns`: what d is, from measured report-to-acknowledgement delays.
* `percentile` / `percentiles`: the one rank convention every published pNN figure uses.
* Checking a recorded history against an envelope, from outside the system. Both scans are
  one pass (a maximum-subarray scan): the worst interval of a long run is found in time
  linear in the run, so a checker can judge every interval of every run. The mesh's
  telemetry and the strict mode's checkers (tree of rated, capped nodes) share them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

__all__ = [
    "Admission",
    "cap_excess",
    "d_estimate_ns",
    "excess_bound",
    "excess_over_times",
    "excess_over_windows",
    "percentile",
    "percentiles",
    "rate_excess",
]

Admission = tuple[int, int, int]  # (time in ns, node id, units): one recorded admission

NS_PER_S = 1_000_000_000

V = TypeVar("V", int, float)


def percentile(values: Iterable[V], q: float) -> V:
    """The q-quantile (0 <= q <= 1) of `values`, unsorted: `percentiles` with one q."""
    return percentiles(values, q)[0]


def percentiles(values: Iterable[V], *qs: float) -> tuple[V, ...]:
    """The q-quantiles of `values` for each q (0 <= q <= 1), sorting once.

    One convention everywhere: the value at 0-based rank floor(q * n) of the n sorted
    values, the last for q = 1. That is the smallest value with more than a q share of
    the values at or below it, never below nearest-rank, so a p99 used as d never
    understates it; p50 of an even count is the upper median. q * n is rounded to 9
    places first, so 0.29 * 100 is rank 29, not 28."""
    for q in qs:
        if not 0 <= q <= 1:
            raise ValueError(f"percentile: q must be within 0..1, got {q}")
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("percentile: no values")
    return tuple(ordered[min(n - 1, math.floor(round(q * n, 9)))] for q in qs)


def excess_bound(members: int, local_burst_cap: float, rate: float, d_ns: float) -> float:
    """The envelope N*b + R*d of the global mode: each of `members` views may run up to
    `local_burst_cap` ahead of its owner, and the owner admits `rate` a second while usage
    is d in flight. Units are whatever b and R are in (units, or a policy's sub-units)."""
    if members < 0 or local_burst_cap < 0 or rate < 0 or d_ns < 0:
        raise ValueError(
            f"excess_bound: members, b, R and d must be >= 0, got "
            f"{members}, {local_burst_cap}, {rate}, {d_ns}"
        )
    return members * local_burst_cap + rate * d_ns / NS_PER_S


def d_estimate_ns(
    delays_ns: Iterable[int], sync_interval_ns: int, tick_lag_ns: int = 0, *, horizon_ns: int
) -> int:
    """d, the propagation delay of the envelope, from report-to-acknowledgement delays.

    A use waits up to one sync interval for the flush that reports it, then its report
    takes the measured delay to be applied and acknowledged: d is the worst of the delays
    plus one sync interval, and never less than two sync intervals (the wait for the flush
    and for the owner's tick, with no delay measured yet). The worst, not a quantile: every
    view that a slow delay left stale admits on what it holds, so a p99 let a stall of the
    slowest 1% (a loaded machine's scheduler, a GC pause) over-admit past the bound.

    Delays longer than `horizon_ns` (the owner-unreachable threshold, `owner_unreachable_ms`)
    are not propagation: a view whose report waits that long is suspended and admits
    nothing new, and the report waits for the ring to change (failover time).

    Plus `tick_lag_ns`, the worst recent lateness of the worker's sync tick (a process):
    a view's snapshot expires, and its usage is flushed, only when that tick runs, so a
    loop running late serves a view that much longer than the delays alone say."""
    if sync_interval_ns <= 0:
        raise ValueError(f"d_estimate_ns: sync_interval_ns must be > 0, got {sync_interval_ns}")
    if tick_lag_ns < 0:
        raise ValueError(f"d_estimate_ns: tick_lag_ns must be >= 0, got {tick_lag_ns}")
    if horizon_ns <= 0:
        raise ValueError(f"d_estimate_ns: horizon_ns must be > 0, got {horizon_ns}")
    worst = max((d for d in delays_ns if d <= horizon_ns), default=None)
    floor = 2 * sync_interval_ns
    if worst is None:
        return floor + tick_lag_ns
    return max(floor, worst + sync_interval_ns) + tick_lag_ns


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

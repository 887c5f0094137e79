"""The envelope's one bound, one d and one percentile convention (`ratemesh.envelope`)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratemesh.envelope import (
    d_estimate_ns,
    excess_bound,
    percentile,
    percentiles,
)

MS = 1_000_000


def test_percentile_takes_rank_floor_q_n() -> None:
    xs = [40, 10, 30, 20]  # unsorted on purpose
    assert percentiles(xs, 0.0, 0.25, 0.5, 0.74, 0.75, 0.99, 1.0) == (10, 20, 30, 30, 40, 40, 40)
    assert percentile(range(1, 101), 0.99) == 100  # rank 99 of 0..99: the top one
    assert percentile(range(1, 1001), 0.99) == 991
    assert percentile(range(100), 0.29) == 29  # 0.29 * 100 is 28.999..., rounded first
    assert percentile([7.5], 0.5) == 7.5


@given(st.lists(st.integers(-1000, 1000), min_size=1, max_size=60), st.floats(0, 1))
def test_percentile_is_the_smallest_value_with_more_than_q_at_or_below(
    xs: list[int], q: float
) -> None:
    p = percentile(xs, q)
    n = len(xs)
    if q == 1:
        assert p == max(xs)
        return
    assert sum(x <= p for x in xs) > round(q * n, 9)
    smaller = [x for x in xs if x < p]
    assert not smaller or sum(x <= max(smaller) for x in xs) <= round(q * n, 9)
    # never below nearest-rank (rank ceil(q * n)), so a p99 used as d never understates it
    assert p >= sorted(xs)[max(0, math.ceil(round(q * n, 9)) - 1)]


def test_percentile_refuses_no_values_and_q_outside_0_1() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match="q must be within 0..1, got 99"):
        percentiles([1, 2], 0.5, 99)


def test_the_bound_is_n_b_plus_r_d() -> None:
    assert excess_bound(3, 20, 1000, 20 * MS) == 3 * 20 + 1000 * 0.020
    assert excess_bound(0, 20, 0, 0) == 0
    with pytest.raises(ValueError, match="must be >= 0"):
        excess_bound(-1, 20, 1000, 0)


def test_d_is_the_worst_delay_plus_a_sync_interval_and_at_least_two_intervals() -> None:
    sync, horizon = 5 * MS, 100 * MS
    assert d_estimate_ns([], sync, horizon_ns=horizon) == 2 * sync  # nothing measured yet
    assert d_estimate_ns([1 * MS] * 50, sync, horizon_ns=horizon) == 2 * sync  # the floor
    delays = [i * MS // 10 for i in range(1000)]  # 0 .. 99.9 ms
    assert d_estimate_ns(delays, sync, horizon_ns=horizon) == max(delays) + sync
    # the slowest 1% counts: a stall leaves views stale for all of it (a p99 did not)
    assert d_estimate_ns([2 * MS] * 999 + [60 * MS], sync, horizon_ns=horizon) == 65 * MS
    # a report stranded at a dead owner (failover, not propagation) does not widen d
    assert d_estimate_ns([*delays[:-1], 60_000 * MS], sync, horizon_ns=horizon) == (
        max(delays[:-1]) + sync
    )
    with pytest.raises(ValueError, match="sync_interval_ns must be > 0"):
        d_estimate_ns(delays, 0, horizon_ns=horizon)
    with pytest.raises(ValueError, match="horizon_ns must be > 0"):
        d_estimate_ns(delays, sync, horizon_ns=0)


def test_d_counts_the_sync_ticks_lateness_on_top() -> None:
    """A view expires, and its usage is flushed, only when its tick runs: d adds how late
    the tick ran, over the delays' figure and over the floor alike; a negative lag is a
    mistake, named."""
    from ratemesh.envelope import d_estimate_ns

    ms = 1_000_000
    h = 100 * ms
    assert d_estimate_ns([], 5 * ms, 7 * ms, horizon_ns=h) == 17 * ms
    assert d_estimate_ns([20 * ms] * 10, 5 * ms, 3 * ms, horizon_ns=h) == 28 * ms
    with pytest.raises(ValueError, match="tick_lag_ns"):
        d_estimate_ns([], 5 * ms, -1, horizon_ns=h)

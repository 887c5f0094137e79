"""The envelope checkers (one-pass maximum-subarray scans) against the definition, checked
interval by interval over random histories (hypothesis: derandomized, so each example
replays from its printed blob)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.telemetry import excess_over_times, excess_over_windows

NS = 1_000_000_000


def brute_windows(buckets: list[int], rate: float, burst: int, bucket_s: float) -> float:
    worst = float("-inf")
    for i in range(len(buckets)):
        for j in range(i + 1, len(buckets) + 1):
            worst = max(worst, sum(buckets[i:j]) - burst - rate * (j - i) * bucket_s)
    return worst


def brute_times(times: list[int], amounts: list[int], rate: float, burst: int) -> float:
    worst = float("-inf")
    for i in range(len(times)):
        for j in range(i, len(times)):
            span_s = (times[j] - times[i]) / NS
            worst = max(worst, sum(amounts[i : j + 1]) - rate * span_s - burst)
    return worst


@given(
    st.lists(st.integers(0, 50), max_size=40),
    st.floats(0, 5000, allow_nan=False),
    st.integers(0, 100),
)
def test_windows_scan_equals_every_window(buckets: list[int], rate: float, burst: int) -> None:
    got = excess_over_windows(buckets, rate, burst, 0.01)
    assert got == pytest.approx(brute_windows(buckets, rate, burst, 0.01), abs=1e-6)


@given(
    st.lists(st.tuples(st.integers(0, 10**8), st.integers(1, 5)), max_size=40),
    st.floats(0, 5000, allow_nan=False),
    st.integers(0, 100),
)
def test_times_scan_equals_every_interval(
    events: list[tuple[int, int]], rate: float, burst: int
) -> None:
    events.sort()
    times, amounts = [t for t, _ in events], [a for _, a in events]
    got = excess_over_times(times, amounts, rate, burst)
    assert got == pytest.approx(brute_times(times, amounts, rate, burst), abs=1e-6)


def test_an_exact_limiter_keeps_the_guarantee_and_one_more_unit_breaks_it() -> None:
    """B at once, then one unit every 1/R: never above; one extra unit is excess 1."""
    rate, burst = 100.0, 10
    times = [0] * burst + [k * NS // 100 for k in range(1, 501)]
    amounts = [1] * len(times)
    assert excess_over_times(times, amounts, rate, burst) == pytest.approx(0)
    extra = sorted([*times, 250 * NS // 100])
    assert excess_over_times(extra, [1] * len(extra), rate, burst) == pytest.approx(1)


def test_bad_histories_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="in order"):
        excess_over_times([5, 4], [1, 1], 1.0, 1)
    with pytest.raises(ValueError, match="differ in length"):
        excess_over_times([1, 2], [1], 1.0, 1)
    assert excess_over_times([], [], 1.0, 1) == float("-inf")

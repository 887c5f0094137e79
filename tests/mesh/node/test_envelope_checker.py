"""The envelope checker (tests/mesh/_envelope.py) against the definition, by brute force:
every interval [x, y] between recorded instants, every admission surely inside it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.mesh._envelope import NS, Admission, IdealBucket, violations, worst_interval

exact = st.tuples(st.integers(0, 3 * NS), st.integers(1, 12)).map(lambda t: Admission(*t))
timed = st.tuples(st.integers(0, 3 * NS), st.integers(1, 12), st.integers(0, NS // 5)).map(
    lambda t: Admission(t[0] + t[2], t[1], lo_ns=t[0])
)
histories = st.lists(exact | timed, min_size=1, max_size=40)


def _brute(adm: list[Admission], rate: int) -> float:
    best = float("-inf")
    for x in {a.start_ns for a in adm}:
        for y in {a.hi_ns for a in adm}:
            if y < x:
                continue
            units = sum(a.units for a in adm if x <= a.start_ns and a.hi_ns <= y)
            best = max(best, units - rate * (y - x) / NS)
    return best


@given(histories, st.integers(1, 500))
def test_worst_interval_is_the_largest_excess_over_every_interval(
    adm: list[Admission], rate: int
) -> None:
    worst = worst_interval(adm, rate)
    assert worst is not None
    assert abs(worst.excess - _brute(adm, rate)) < 1e-6
    inside = sum(a.units for a in adm if worst.start_ns <= a.start_ns <= a.hi_ns <= worst.end_ns)
    assert inside == worst.units
    assert abs(worst.units - rate * (worst.end_ns - worst.start_ns) / NS - worst.excess) < 1e-6


@given(histories, st.integers(1, 500), st.integers(0, 60))
def test_violations_count_the_ends_past_the_allowed_excess(
    adm: list[Admission], rate: int, allowed: int
) -> None:
    n = violations(adm, rate, allowed)
    assert (n == 0) == (_brute(adm, rate) <= allowed)


def test_a_steady_stream_at_the_rate_stays_within_the_burst() -> None:
    adm = [Admission(k * NS // 50, 1) for k in range(500)]  # 50/s for 10 s
    worst = worst_interval(adm, 50)
    assert worst is not None and worst.excess <= 1.0 + 1e-9
    assert violations(adm, 50, 1) == 0
    burst = adm + [Admission(5 * NS, 1)] * 20  # 20 more at one instant
    assert violations(burst, 50, 10) > 0
    # 20 at one instant break B=10; known only to within a second each, they prove nothing
    assert violations([Admission(5 * NS, 1)] * 20, 50, 10) > 0
    assert violations([Admission(5 * NS, 1, lo_ns=4 * NS)] * 20, 50, 10) == 0


def test_the_ideal_bucket_refills_to_its_burst_and_goes_negative_when_overspent() -> None:
    adm = [Admission(NS, 10), Admission(NS, 10), Admission(2 * NS, 1)]
    bucket = IdealBucket(adm, rate=5, burst=10, t0_ns=0)
    assert bucket.level(NS // 2) == 2.5
    assert bucket.level(NS) == -15.0  # 5 refilled, 20 spent
    assert bucket.level(2 * NS) == -11.0  # +5, -1
    assert bucket.least(0, 3 * NS) == -15.0
    assert bucket.level(10 * NS) == 10.0  # capped at the burst

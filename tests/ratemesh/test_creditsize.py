"""The credit sizing formulas (`ratemesh.creditsize`): what they promise for any R, B and
round trip, since the holder, its loop and `mesh validate` all read them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ratemesh.credit import PPM, CreditConfig, CreditHolder, Reserve, node_burst, node_rate
from ratemesh.creditsize import (
    DRAINED_WAIT_MAX_MS,
    DRAINED_WAIT_MIN_MS,
    LEAD_MIN_MS,
    ROUND_TRIP_MAX_MS,
    UTILISATION_TARGET,
    block_cap,
    burst_needed,
    drained_wait_base_ms,
    lead_ms,
    next_round_trip_ms,
    utilisation_bound,
    wait_for_target_ms,
)

RATES = st.integers(1, 10**7)
BURSTS = st.integers(1, 10**8)
TRIPS = st.integers(0, 500)
SHARES = st.integers(1, PPM)


@settings(max_examples=300, deadline=None)
@given(rate=RATES, burst=BURSTS, trip=TRIPS, share=st.integers(1, PPM // 2))
def test_default_sizing_serves_the_bucket_wherever_its_burst_outlasts_two_round_trips(
    rate: int, burst: int, trip: int, share: int
) -> None:
    """Derived (no configured lead): the drained wait is a quarter of B / R within its
    bounds, and one worker alone is served at the target whenever B / R covers the round
    trip and its wait with room for a block; a configured lead is kept as it is."""
    wait = drained_wait_base_ms(None, rate, burst)
    assert DRAINED_WAIT_MIN_MS <= wait <= DRAINED_WAIT_MAX_MS
    span_ms = burst * 1000 / rate
    if DRAINED_WAIT_MIN_MS * 4 <= span_ms <= DRAINED_WAIT_MAX_MS * 4:
        assert abs(wait - span_ms / 4) <= 1
    bound = utilisation_bound(rate, burst, round_trip_ms=trip, wait_ms=wait, share_ppm=share)
    assert 0.0 <= bound <= 1.0
    room = 1 - share / PPM
    if span_ms * room >= (trip + wait + 1) * UTILISATION_TARGET:
        assert bound >= UTILISATION_TARGET - 1e-9
    assert drained_wait_base_ms(77, rate, burst) == 77
    assert drained_wait_base_ms(None, None, burst) == DRAINED_WAIT_MAX_MS


@settings(max_examples=200, deadline=None)
@given(rate=RATES, burst=BURSTS, trip=TRIPS, share=st.integers(1, PPM - 1))
def test_the_wait_and_burst_validate_suggests_do_reach_the_target(
    rate: int, burst: int, trip: int, share: int
) -> None:
    """`mesh validate`'s fixes are right: the lead it names meets the target, and the
    burst it names does with default settings while one unit less does not."""
    best = wait_for_target_ms(rate, burst, round_trip_ms=trip, share_ppm=share)
    if best > 0:
        bound = utilisation_bound(rate, burst, round_trip_ms=trip, wait_ms=best, share_ppm=share)
        assert bound >= UTILISATION_TARGET - 1e-9
    need = burst_needed(rate, round_trip_ms=trip, share_ppm=share)

    def served(b: int) -> float:
        wait = drained_wait_base_ms(None, rate, b)
        return utilisation_bound(rate, b, round_trip_ms=trip, wait_ms=wait, share_ppm=share)

    assert served(need) >= UTILISATION_TARGET
    assert need == 1 or served(need - 1) < UTILISATION_TARGET


@given(trip=TRIPS, configured=st.none() | st.integers(1, 10_000))
def test_the_lead_covers_two_round_trips_unless_configured(
    trip: int, configured: int | None
) -> None:
    lead = lead_ms(configured, trip)
    assert lead == configured if configured is not None else lead >= max(LEAD_MIN_MS, 2 * trip)


@given(burst=st.none() | BURSTS, share=SHARES, block_max=st.integers(1, 10**9))
def test_a_block_is_at_most_its_share_of_the_burst(
    burst: int | None, share: int, block_max: int
) -> None:
    cap = block_cap(burst, share, block_max)
    assert 1 <= cap <= block_max
    if burst is not None and burst * share >= PPM:
        assert cap <= burst * share // PPM


@given(samples=st.lists(st.integers(-10, 10**6), min_size=1, max_size=50))
def test_the_round_trip_estimate_stays_within_its_samples(samples: list[int]) -> None:
    estimate = None
    for s in samples:
        estimate = next_round_trip_ms(estimate, s)
    bounded = [max(0, min(ROUND_TRIP_MAX_MS, s)) for s in samples]
    assert estimate is not None and min(bounded) <= estimate <= max(bounded)


def test_the_holder_sizes_from_what_governord_said_and_the_round_trips_it_saw() -> None:
    """R = 2,000/s and B = 100 (B / R 50 ms): a drained worker waits about 12 ms, not the
    former 250 ms; the lead follows the measured round trip."""
    h = CreditHolder(CreditConfig())
    assert h.drained_wait_base_ms() == DRAINED_WAIT_MAX_MS  # R and B not known yet
    h.learn_burst(100, 2_000)
    assert h.drained_wait_base_ms() == 12
    h.granted(30, Reserve(0, 10), 1, 10, 1_000)
    assert h.round_trip_ms == 30 and h.lead_ms() == 70
    assert CreditHolder(CreditConfig(lead_ms=250)).drained_wait_base_ms() == 250


def test_a_nodes_rate_is_read_from_getnode_and_a_bad_shape_is_none() -> None:
    node = {"rates": {"read_iops": [2_000, 100]}}
    assert (node_rate(node, "read_iops"), node_burst(node, "read_iops")) == (2_000, 100)
    for bad in ({}, {"rates": {"read_iops": [0, 100]}}, {"rates": {"read_iops": "2000"}}, None):
        assert node_rate(bad, "read_iops") is None
    assert node_rate(node, "write_iops") is None

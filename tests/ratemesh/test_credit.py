"""The worker's credit holder: local expiry timed from the send, all-or-nothing spends, the
verdict reasons, refills, returns, and bad input refused without a change."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratemesh.credit import (
    DENIED_BACKOFF_MAX_MS,
    DENIED_BACKOFF_MIN_MS,
    GOVERNOR_UNREACHABLE,
    NO_CREDIT,
    CreditConfig,
    CreditHolder,
    Reserve,
    denied_backoff_ms,
    drained_wait_ms,
    local_expiry_ms,
    node_burst,
    rate_burst,
)
from ratemesh.errors import ConfigError

SENT_AT_0 = Reserve(0, 1)  # a reserve sent at 0, for blocks handed over directly


def test_local_expiry_is_timed_from_the_send_with_the_drift_margin() -> None:
    assert local_expiry_ms(1_000, 10_000, 1_000, 50) == 1_000 + 9_980 - 50
    assert local_expiry_ms(0, 3, 0, 0) == 3
    # rounding takes the earlier side
    assert local_expiry_ms(0, 999, 1, 0) == 998


def test_a_block_is_spent_until_its_local_expiry_then_never() -> None:
    h = CreditHolder(CreditConfig(rho_ppm=0, epsilon_ms=10))
    assert h.try_spend(0).reason == NO_CREDIT
    req = h.refill(0)
    assert req is not None and h.refill(0) is None  # one reserve in flight at a time
    h.granted(400, req, 7, 5, 1_000)  # the reply came late: still timed from the send at 0
    assert h.try_spend(989, 2).admitted
    assert not h.try_spend(990).admitted  # 0 + 1000 - 10
    assert h.held(990) == 0


def test_a_spend_is_all_or_nothing_and_takes_the_earliest_block_first() -> None:
    h = CreditHolder(CreditConfig(rho_ppm=0, epsilon_ms=0))
    h.try_spend(0)
    r1 = h.refill(0)
    assert r1 is not None
    h.granted(0, r1, 1, 3, 500)
    h.in_flight = None
    h.granted(0, SENT_AT_0, 2, 3, 900)
    spend = h.try_spend(10, 4)
    assert spend.admitted and spend.taken == ((1, 3), (2, 1))
    before = h.held(10)
    assert not h.try_spend(10, 3).admitted and h.held(10) == before


def test_spends_in_a_row_answer_as_the_full_spend_would() -> None:
    """The hot path's one step (spends after the first, from the same block) takes from the
    earliest block with units, stops at any block's local expiry, sees a new earlier block,
    and still refuses time going back."""
    h = CreditHolder(CreditConfig(rho_ppm=0, epsilon_ms=0))
    h.granted(0, SENT_AT_0, 1, 3, 500)
    h.granted(0, SENT_AT_0, 2, 100, 900)
    assert [h.try_spend(t).taken for t in (1, 2, 3, 4)] == [((1, 1),)] * 3 + [((2, 1),)]
    assert h.try_spend(499).taken == ((2, 1),)
    assert h.try_spend(500).taken == ((2, 1),) and 1 not in h.blocks  # block 1 expired at 500
    h.granted(600, Reserve(550, 1), 3, 2, 300)  # expires at 850, before block 2
    assert [h.try_spend(t).taken for t in (601, 602, 603)] == [((3, 1),)] * 2 + [((2, 1),)]
    assert h.held(603) == 100 - 4
    assert h.try_spend(899).admitted and not h.try_spend(900).admitted  # block 2's expiry
    with pytest.raises(ConfigError):
        h.try_spend(899)


def test_unreachable_governor_fails_closed_once_everything_has_expired() -> None:
    h = CreditHolder(CreditConfig(rho_ppm=0, epsilon_ms=0, lead_ms=250))
    h.try_spend(0)
    req = h.refill(0)
    assert req is not None
    h.granted(0, req, 1, 2, 100)
    again = h.refill(0)
    assert again is not None
    h.failed(again, unreachable=True)
    assert h.try_spend(50).admitted  # what is held is still spent
    verdict = h.try_spend(100)
    assert not verdict.admitted and verdict.reason == GOVERNOR_UNREACHABLE
    third = h.refill(100)
    assert third is not None
    h.granted(100, third, 2, 1, 100)
    assert h.try_spend(101).admitted and not h.unreachable


def test_a_reserve_unanswered_too_long_says_governor_unreachable() -> None:
    h = CreditHolder(CreditConfig(unreachable_after_ms=500))
    assert h.try_spend(0).reason == NO_CREDIT
    assert h.refill(0) is not None
    assert h.try_spend(499).reason == NO_CREDIT
    assert h.try_spend(500).reason == GOVERNOR_UNREACHABLE


def test_returns_take_spent_out_blocks_at_once_and_everything_when_idle_or_leaving() -> None:
    cfg = CreditConfig(rho_ppm=0, epsilon_ms=0, idle_ms=100)
    h = CreditHolder(cfg)
    h.try_spend(0)
    r = h.refill(0)
    assert r is not None
    h.granted(0, r, 1, 1, 10_000)
    h.in_flight = None
    h.granted(0, SENT_AT_0, 2, 5, 10_000)
    assert h.try_spend(1).taken == ((1, 1),)
    assert h.take_returns(2) == [(1, 0)]
    assert h.take_returns(50) == []
    assert h.take_returns(200) == [(2, 5)]  # idle
    assert h.try_spend(201).reason == NO_CREDIT  # returned credit is never spent
    h.in_flight = None
    h.granted(201, SENT_AT_0, 3, 4, 10_000)
    assert h.take_returns(202, leaving=True) == [(3, 4)]


def test_a_block_granted_after_its_local_expiry_is_returned_whole() -> None:
    h = CreditHolder(CreditConfig(rho_ppm=0, epsilon_ms=0))
    h.try_spend(0)
    req = h.refill(0)
    assert req is not None
    h.granted(600, req, 9, 4, 500)
    assert not h.try_spend(600).admitted
    assert h.take_returns(600) == [(9, 4)]


def test_block_size_and_low_water_follow_demand_within_bounds() -> None:
    cfg = CreditConfig(block_min=2, block_max=50, horizon_ms=1_000, lead_ms=200)
    h = CreditHolder(cfg)
    assert h.block_size(0) == 2 and h.low_water(0) == 0
    for t in range(0, 5_000, 10):  # 100 units/s of demand
        h.try_spend(t)
    assert h.block_size(5_000) == 50  # 100/s * 1 s, capped at block_max
    assert h.low_water(5_000) == 20  # 100/s * 0.2 s
    assert h.refill(5_000) is not None
    assert h.refill(20_000) is None  # idle: nothing is wanted, nothing is reserved


def test_demand_is_measured_over_the_span_its_bounded_samples_cover() -> None:
    h = CreditHolder(CreditConfig(demand_samples_max=100, demand_window_ms=5_000))
    for t in range(0, 200):  # 1,000 units/s, twice as many samples as it keeps
        h.try_spend(t)
    assert 900 < h.demand_per_s(200) <= 1_100


def test_blocks_stay_a_share_of_the_burst_once_governord_states_it() -> None:
    """A block counts whole against B until it is spent out: with blocks of a second of
    demand and B under R x 1 s, one worker's block took a small bucket whole."""
    h = CreditHolder(CreditConfig(horizon_ms=1_000, burst_share_ppm=250_000))
    for t in range(0, 1_000):  # 3,000 units/s
        h.try_spend(t, 3)
    assert h.block_size(1_000) > 2_000  # a second of demand
    req = h.refill(1_000)
    assert req is not None
    h.failed(req, unreachable=False, burst=1_000)  # an empty bucket's denial states B
    assert h.burst == 1_000 and h.block_size(1_000) == 250
    h.learn_burst(2_000)  # a looser B elsewhere on the chain changes nothing
    assert h.block_size(1_000) == 250
    h.learn_burst(8)  # the smallest B told bounds the blocks, never below block_min
    assert h.block_size(1_000) == 2
    assert CreditHolder(CreditConfig(block_min=3)).block_size(0) == 3
    h.learn_burst(1)
    assert h.block_size(1_000) == 1
    with pytest.raises(ConfigError) as info:
        h.learn_burst(0)
    assert info.value.field == "burst"
    with pytest.raises(ConfigError) as info:
        CreditConfig(burst_share_ppm=0)
    assert info.value.field == "burst_share_ppm"


def test_what_governord_says_of_a_burst_is_read_strictly() -> None:
    assert rate_burst({"reason": "rate", "limit": 1_000, "used": 1_000}) == 1_000
    denials: tuple[object, ...] = (
        {"reason": "quota", "limit": 5},
        {"reason": "rate", "limit": 0},
        {},
        None,
        3,
    )
    for bad in denials:
        assert rate_burst(bad) is None
    assert rate_burst({"reason": "rate", "limit": True}) is None
    assert node_burst({"rates": {"read_iops": [2_000, 1_000]}}, "read_iops") == 1_000
    assert node_burst({"rates": {"read_iops": [2_000, 1_000]}}, "http") is None
    nodes: tuple[object, ...] = (
        {},
        {"rates": []},
        {"rates": {"read_iops": [1]}},
        {"rates": {"read_iops": 5}},
    )
    for node in nodes:
        assert node_burst(node, "read_iops") is None


def test_waits_after_a_denial() -> None:
    assert denied_backoff_ms(0) == DENIED_BACKOFF_MIN_MS
    assert denied_backoff_ms(DENIED_BACKOFF_MIN_MS) == 2 * DENIED_BACKOFF_MIN_MS
    assert denied_backoff_ms(DENIED_BACKOFF_MAX_MS) == DENIED_BACKOFF_MAX_MS
    waits = {drained_wait_ms(250, t) for t in range(0, 10**9, 10**6 + 7)}
    assert min(waits) >= 125 and max(waits) < 375
    assert len(waits) > 100  # spread: workers refused together do not ask together again
    assert drained_wait_ms(1, 12345) in (0, 1)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda h: h.try_spend(5, 0), "units"),
        (lambda h: h.try_spend(5, True), "units"),
        (lambda h: h.try_spend("0"), "now_ms"),
        (lambda h: h.try_spend(-(2**63)), "now_ms"),
        (lambda h: h.granted(5, SENT_AT_0, 0, 1, 1), "block_id"),
        (lambda h: h.granted(5, SENT_AT_0, 1, 1, 0), "ttl_ms"),
    ],
)
def test_bad_input_names_the_field_and_changes_nothing(call: object, field: str) -> None:
    h = CreditHolder()
    h.try_spend(5)
    before = (dict(h.blocks), h.in_flight, h.unreachable, h.held(5))
    with pytest.raises(ConfigError) as info:
        call(h)  # type: ignore[operator]
    assert info.value.field == field
    assert (dict(h.blocks), h.in_flight, h.unreachable, h.held(5)) == before


def test_time_going_back_is_refused() -> None:
    h = CreditHolder()
    h.held(10)
    with pytest.raises(ConfigError) as info:
        h.try_spend(9)
    assert info.value.field == "now_ms"


def test_config_names_the_bad_knob() -> None:
    with pytest.raises(ConfigError) as info:
        CreditConfig(rho_ppm=400_000)
    assert info.value.field == "rho_ppm"
    with pytest.raises(ConfigError) as info:
        CreditConfig(block_min=5, block_max=4)
    assert info.value.field == "block_max"


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["spend", "refill", "reply", "fail", "return", "leave"]),
        st.integers(0, 300),  # time step
        st.integers(1, 20),  # units / ttl scale
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(_OPS, st.integers(0, 20_000), st.integers(0, 100))
def test_never_spends_more_than_granted_nor_after_a_local_expiry(
    ops: list[tuple[str, int, int]], rho_ppm: int, epsilon_ms: int
) -> None:
    """Whatever the driver does, every admitted unit comes from a block granted and not
    returned, before that block's local expiry measured from its send."""
    h = CreditHolder(CreditConfig(rho_ppm=rho_ppm, epsilon_ms=epsilon_ms, idle_ms=500))
    now, next_id = 0, 1
    granted: dict[int, tuple[int, int]] = {}  # id -> (units, local expiry)
    spent: dict[int, int] = {}
    returned: dict[int, int] = {}
    for op, dt, n in ops:
        now += dt
        if op == "spend":
            verdict = h.try_spend(now, n)
            got = sum(u for _, u in verdict.taken)
            assert got == (n if verdict.admitted else 0)
            for bid, u in verdict.taken:
                assert now < granted[bid][1], "spent at or after its local expiry"
                assert bid not in returned, "spent after it was returned"
                spent[bid] = spent.get(bid, 0) + u
        elif op == "refill":
            h.refill(now)
        elif op == "reply" and h.in_flight is not None:
            req = h.in_flight
            ttl = n * 100
            granted[next_id] = (n, local_expiry_ms(req.sent_at_ms, ttl, rho_ppm, epsilon_ms))
            h.granted(now, req, next_id, n, ttl)
            next_id += 1
        elif op == "fail" and h.in_flight is not None:
            h.failed(h.in_flight, unreachable=n % 2 == 0)
        elif op in ("return", "leave"):
            for bid, unused in h.take_returns(now, leaving=op == "leave"):
                assert bid not in returned
                assert unused == granted[bid][0] - spent.get(bid, 0)
                returned[bid] = unused
    for bid, units in spent.items():
        assert units <= granted[bid][0]


def test_a_thin_key_is_not_refilled_ahead_but_asks_when_an_admission_needs_credit() -> None:
    """Refilling ahead (a driver's tick) needs a unit of expected demand before `idle_ms`
    would give it back: a key asked for once stays empty until asked again, where the
    waiting form's refill (`ahead=False`) and `begin` still ask; a busier key is refilled."""
    cfg = CreditConfig()
    thin = CreditHolder(cfg)
    assert thin.try_spend(0).reason == NO_CREDIT  # one want in the demand window
    assert thin.refill(10, ahead=True) is None
    assert thin.refill(10) is not None  # an admission is waiting on it
    busy = CreditHolder(cfg)
    for t in range(0, 50, 10):  # five wants in 50 ms: far more than a unit per idle_ms
        busy.try_spend(t)
    assert busy.refill(50, ahead=True) is not None

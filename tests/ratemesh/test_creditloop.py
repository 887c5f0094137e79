"""The credit refill and back-off machine: when a worker asks governord, and how long it waits
after each kind of answer. The mesh's strict gates, the SDK and the simulator all drive this
one object, so these are the rules for all three."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ratemesh.credit import (
    DENIED_BACKOFF_MAX_MS,
    DENIED_BACKOFF_MIN_MS,
    GOVERNOR_UNREACHABLE,
    NO_CREDIT,
    CreditConfig,
    Reserve,
    drained_wait_ms,
)
from ratemesh.creditloop import UNREACHABLE_RETRY_MS, CreditLoop

LEAD_MS = 40  # configured: the drained wait is the lead, as before sizing was derived
CONFIG = CreditConfig(rho_ppm=0, epsilon_ms=0, lead_ms=LEAD_MS, idle_ms=1_000)


def _asking(now_ms: int = 0, units: int = 5) -> tuple[CreditLoop, Reserve]:
    loop = CreditLoop(CONFIG)
    assert not loop.holder.try_spend(now_ms, units).admitted
    request = loop.short(now_ms, units)
    assert request is not None
    return loop, request


def test_a_shortfall_asks_at_once_for_at_least_what_was_wanted_one_at_a_time() -> None:
    loop, request = _asking(units=7)
    assert request.units >= 7 and request.sent_at_ms == 0
    assert loop.short(0, 7) is None and loop.ahead(0) is None  # one reserve in flight


def test_a_full_grant_is_spent_and_the_next_ask_is_not_delayed() -> None:
    loop, request = _asking()
    block = loop.granted(3, request, 1, request.units, 1_000, instant=3)
    assert block is not None and loop.holder.try_spend(3, 5).admitted
    assert loop.retry_at_ms < 3 and loop.backoff_ms == 0


def test_a_partial_grant_waits_about_lead_ms_before_asking_again() -> None:
    loop, request = _asking(units=10)
    assert loop.granted(5, request, 1, 1, 1_000, instant=12_345) is not None
    assert loop.retry_at_ms == 5 + drained_wait_ms(LEAD_MS, 12_345)
    assert LEAD_MS // 2 <= loop.retry_at_ms - 5 < LEAD_MS * 3 // 2
    assert loop.short(loop.retry_at_ms - 1, 10) is None
    assert loop.short(loop.retry_at_ms, 10) is not None


def test_an_empty_buckets_denial_waits_like_a_partial_grant_and_bounds_blocks() -> None:
    loop, request = _asking()
    loop.backoff_ms = 80  # a doubling back-off from before is cleared
    loop.denied(9, request, 12, instant=7)
    assert loop.holder.in_flight is None and loop.holder.burst == 12
    assert loop.backoff_ms == 0
    assert loop.retry_at_ms == 9 + drained_wait_ms(LEAD_MS, 7)
    assert loop.holder.try_spend(9).reason == NO_CREDIT


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=1, max_value=12))
def test_other_denials_back_off_doubling_to_the_maximum(times: int) -> None:
    loop, now = CreditLoop(CONFIG), 0
    assert not loop.holder.try_spend(now).admitted
    waits = []
    for _ in range(times):
        request = loop.short(now, 1)
        assert request is not None
        loop.denied(now, request, None, instant=now)
        waits.append(loop.retry_at_ms - now)
        assert loop.short(loop.retry_at_ms - 1, 1) is None  # backing off
        now = loop.retry_at_ms
    expected = [min(DENIED_BACKOFF_MAX_MS, DENIED_BACKOFF_MIN_MS << i) for i in range(times)]
    assert waits == expected


def test_unreachable_fails_closed_and_waits_before_asking_again() -> None:
    loop, request = _asking()
    loop.unreachable(20, request)
    assert loop.holder.try_spend(20).reason == GOVERNOR_UNREACHABLE
    assert loop.retry_at_ms == 20 + UNREACHABLE_RETRY_MS
    assert loop.short(20 + UNREACHABLE_RETRY_MS, 1) is not None


def test_an_overdue_reserve_is_given_up_and_a_new_one_may_go_at_once() -> None:
    loop, request = _asking()
    late = CONFIG.unreachable_after_ms
    assert not loop.overdue(late - 1) and loop.holder.in_flight is request
    assert loop.overdue(late) and loop.holder.in_flight is None
    assert loop.holder.why_not(late) == GOVERNOR_UNREACHABLE
    fresh = loop.short(late, 1)
    assert fresh is not None and fresh.sent_at_ms == late


def test_a_grant_that_does_not_fit_holds_nothing_and_ends_the_reserve() -> None:
    loop, request = _asking()
    assert loop.granted(1, request, 0, 5, 1_000, instant=1) is None  # block id 0 is invalid
    assert loop.holder.in_flight is None and not loop.holder.blocks
    assert loop.retry_at_ms < 1  # nothing learned about the bucket: no wait


def test_idle_and_spent_out_blocks_are_handed_back_and_leaving_returns_all() -> None:
    loop, request = _asking(units=1)
    loop.granted(0, request, 1, request.units, 10_000, instant=0)
    assert loop.returns(1) == []
    assert loop.returns(CONFIG.idle_ms) == [(1, request.units)]
    loop2, request2 = _asking(units=1)
    loop2.granted(0, request2, 2, request2.units, 10_000, instant=0)
    assert loop2.returns(1, leaving=True) == [(2, request2.units)]


def test_refills_ahead_of_need_wait_out_a_back_off() -> None:
    loop, request = _asking(units=1)
    loop.granted(0, request, 1, 1, 10_000, instant=0)
    for t in range(1, 30):  # steady demand spends the block out: a refill is due
        loop.holder.try_spend(t, 1)
    assert loop.holder.held(30) == 0
    loop.retry_at_ms = 100
    assert loop.ahead(30) is None
    assert loop.ahead(100) is not None

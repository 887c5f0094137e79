"""GCRA against a brute-force token bucket in exact fractions, on random schedules."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.core.gcra import NS_PER_S, Gcra
from mesh.errors import ConfigError, ConfigTypeError


class Bucket:
    """The reference: a bucket of B tokens refilling continuously at R per second."""

    def __init__(self, rate: int, burst: int, now: int, exhausted: bool = False) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = Fraction(0 if exhausted else burst)
        self.last = now

    def _advance(self, now: int) -> None:
        self.tokens = min(
            Fraction(self.burst), self.tokens + Fraction(self.rate * (now - self.last), NS_PER_S)
        )
        self.last = now

    def try_take(self, now: int, n: int) -> bool:
        self._advance(now)
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def apply(self, now: int, n: int) -> None:
        self._advance(now)
        self.tokens -= n

    def remaining(self, now: int) -> int:
        self._advance(now)
        return max(0, int(self.tokens))


ops = st.lists(
    st.tuples(
        st.sampled_from(["take", "apply", "remaining"]),
        st.integers(0, 50_000_000),
        st.integers(1, 40),
    ),
    max_size=80,
)


@given(
    rate=st.integers(1, 100_000), burst=st.integers(1, 500), exhausted=st.booleans(), schedule=ops
)
def test_gcra_matches_reference_bucket(
    rate: int, burst: int, exhausted: bool, schedule: list[tuple[str, int, int]]
) -> None:
    now = 1_000_000
    g = Gcra(rate, burst, now, exhausted=exhausted)
    ref = Bucket(rate, burst, now, exhausted)
    for op, dt, n in schedule:
        now += dt
        if op == "take":
            assert g.try_take(now, n) == ref.try_take(now, n)
        elif op == "apply":
            g.apply(now, n)
            ref.apply(now, n)
        assert g.remaining(now) == ref.remaining(now)


def test_exhausted_start_refills_at_rate() -> None:
    g = Gcra(100, 10, 0, exhausted=True)
    assert g.remaining(0) == 0
    assert g.remaining(10_000_000) == 1  # 10 ms at 100/s
    assert g.remaining(NS_PER_S) == 10  # capped at B
    assert g.wait_ns(0, 1) == 10_000_000


def test_usage_after_the_fact_becomes_debt() -> None:
    g = Gcra(10, 5, 0)
    g.apply(0, 25)  # 20 more than the burst: 2 s of debt before anything is free
    assert g.remaining(NS_PER_S) == 0
    assert g.remaining(2 * NS_PER_S) == 0
    assert g.remaining(2 * NS_PER_S + 100_000_000) == 1
    assert not g.try_take(2 * NS_PER_S, 1)


def test_no_drift_over_a_day() -> None:
    """A rate whose emission interval is not a whole number of ns: 3/s for 24 h."""
    g = Gcra(3, 1, 0)
    day = 86_400 * NS_PER_S
    times = range(0, day, NS_PER_S // 3 + 1)  # just slower than the rate: all conform
    assert all(g.try_take(t, 1) for t in times)
    assert not g.try_take(times[-1], 1)  # and one more at the same instant does not
    g2 = Gcra(3, 1, 0)
    for s in range(86_400):
        g2.apply(s * NS_PER_S, 3)
    assert g2.tat_scaled == 86_400 * 3 * NS_PER_S  # exactly a day of use, no remainder lost


def test_retune_keeps_debt() -> None:
    g = Gcra(10, 10, 0)
    g.apply(0, 10)
    g.retune(20, 10, 0)
    assert g.remaining(0) == 0
    assert g.remaining(250_000_000) == 5


@pytest.mark.parametrize(
    "args, field, exc",
    [
        ((0, 1, 0), "rate", ConfigError),
        ((-5, 1, 0), "rate", ConfigError),
        ((1, 0, 0), "burst", ConfigError),
        ((1.5, 1, 0), "rate", ConfigTypeError),
        ((1, "2", 0), "burst", ConfigTypeError),
        ((1, 1, -1), "now_ns", ConfigError),
        ((1, 2**70, 0), "burst", ConfigError),
    ],
)
def test_bad_arguments_name_the_field(
    args: tuple[Any, ...], field: str, exc: type[ConfigError]
) -> None:
    with pytest.raises(exc) as info:
        Gcra(*args)
    assert info.value.field == field
    assert field in str(info.value)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 10**6),
    st.integers(1, 10**4),
    st.integers(0, 10**10),
    st.integers(0, 10**5),
    st.integers(0, 10**10),
    st.data(),
)
def test_forecast_is_apply_then_wait_and_ahead_on_a_copy(
    rate: int, burst: int, used_at: int, used: int, later: int, data: st.DataObject
) -> None:
    amount = data.draw(st.integers(1, burst))
    g = Gcra(rate, burst, 0)
    m = g.copy()
    m.apply(used_at, used)
    now = used_at + later
    assert g.forecast(used_at, used, now, amount) == (m.wait_ns(now, amount), m.ahead_ns(now))

"""The rate and amount grammar: one parser, exact results, errors that name the
field and quote the text."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratemesh.errors import ConfigError, ConfigTypeError
from ratemesh.rates import PERIODS_S, format_rate, parse_amount, parse_rate, rate_text


@pytest.mark.parametrize(
    "text, per_s",
    [
        (100, 100),  # an integer keeps meaning per second
        ("100", 100),
        ("100/second", 100),
        ("100/s", 100),
        ("100 / sec", 100),
        ("100/seconds", 100),
        ("6000/minute", 100),
        ("6000/min", 100),
        ("6000/m", 100),
        ("360000/hour", 100),
        ("360000/h", 100),
        ("8640000/day", 100),
        ("8640000/d", 100),
        ("2/ms", 2000),
        ("2/millisecond", 2000),
        ("1k/s", 1000),
        ("1.5k/s", 1500),
        ("3M/minute", 50_000),
        ("1G/s", 10**9),
        ("1KiB/s", 1024),
        ("1MiB/second", 1 << 20),
        ("1GiB/s", 1 << 30),
        ("0.5MiB/s", 1 << 19),
        ("600/10s", 60),
        ("120/2m", 1),
        ("1MiB", 1 << 20),  # no period: per second
    ],
)
def test_good_rates(text: Any, per_s: int) -> None:
    assert parse_rate("target_rate", text) == per_s


@pytest.mark.parametrize(
    "text, exact, back",
    [
        ("5000/minute", Fraction(250, 3), "5000/minute"),
        ("1/hour", Fraction(1, 3600), "1/hour"),
        ("1.5/s", Fraction(3, 2), "90/minute"),
        ("7/13s", Fraction(7, 13), "7/13s"),
        ("1/day", Fraction(1, 86400), "1/day"),
        ("2/1500ms", Fraction(4, 3), "80/minute"),
        ("1/30d", Fraction(1, 2592000), "1/2592000s"),
    ],
)
def test_rates_not_whole_per_second_are_exact(text: str, exact: Fraction, back: str) -> None:
    """Issue 14: no longer refused; the exact rate, and text that reads back to it."""
    got = parse_rate("target_rate", text)
    assert got == exact
    assert rate_text(got.numerator, got.denominator) == back
    assert parse_rate("target_rate", back) == exact


@given(
    st.integers(1, 10**9),
    st.integers(1, 999_999),
    st.sampled_from(["ms", "s", "minute", "h", "d"]),
)
def test_rate_text_reads_back(count: int, n: int, unit: str) -> None:
    exact = Fraction(count) / (PERIODS_S[unit] * n)
    assert parse_rate("r", f"{count}/{n}{unit}") == exact
    assert parse_rate("r", rate_text(exact.numerator, exact.denominator)) == exact


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "100/fortnight",
            '"100/fortnight": unknown period "fortnight"; use second, minute, hour or day',
        ),
        ("100/", "\"100/\": missing period after '/'; use second, minute, hour or day"),
        ("1XiB/s", '"1XiB/s": unknown size "XiB"; use k, M, G (decimal) or KiB, MiB, GiB (binary)'),
        ("lots/s", '"lots/s": expected a number with an optional size, such as 100 or 1MiB'),
        ("-5/s", '"-5/s": expected a number with an optional size, such as 100 or 1MiB'),
        ("0/s", '"0/s" must be >= 1'),
        ("100/0s", '"100/0s": the period must be longer than zero'),
        ("", "must not be empty"),
        ("9" * 80, "must be at most 64 characters, got 80"),
        (0, "must be >= 1, got 0"),
        (2**64, f"must be <= {2**63 - 1}, got {2**64}"),
    ],
)
def test_bad_rates_name_the_field_and_the_text(text: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_rate("target_rate", text)
    assert info.value.field == "target_rate"
    assert info.value.problem == problem
    assert str(info.value) == f"target_rate: {problem}"


@pytest.mark.parametrize("value", [1.5, True, None, [100]])
def test_a_rate_of_the_wrong_type_is_a_type_error(value: Any) -> None:
    with pytest.raises(ConfigTypeError, match="target_rate: must be an integer"):
        parse_rate("target_rate", value)


@pytest.mark.parametrize(
    "text, n",
    [
        (64, 64),
        ("64", 64),
        ("1MiB", 1 << 20),
        ("256KiB", 256 << 10),
        ("1.5k", 1500),
        ("2G", 2 * 10**9),
    ],
)
def test_good_amounts(text: Any, n: int) -> None:
    assert parse_amount("global_burst", text) == n


@pytest.mark.parametrize(
    "text, problem",
    [
        ("1.5", '"1.5" is not a whole number of units'),
        ("1MiB/s", '"1MiB/s": expected a number with an optional size, such as 100 or 1MiB'),
        ("1mb", '"1mb": unknown size "mb"; use k, M, G (decimal) or KiB, MiB, GiB (binary)'),
        (0, "must be >= 1, got 0"),
    ],
)
def test_bad_amounts(text: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_amount("global_burst", text)
    assert (info.value.field, info.value.problem) == ("global_burst", problem)


def test_format_rate_reads_back() -> None:
    for per_s, period in [(83, "minute"), (1, "hour"), (2000, "ms"), (7, "10s")]:
        assert parse_rate("r", format_rate(per_s, period).strip('"')) == per_s

"""The rate and amount grammar: one parser, exact results, errors that name the
field and quote the text."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratemesh.errors import ConfigError, ConfigTypeError
from ratemesh.policyfile import parse_policy_list
from ratemesh.rates import (
    PERIODS_S,
    RATES_MAX,
    format_rate,
    parse_amount,
    parse_rate,
    parse_rates,
    rate_text,
)


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
        ("1/30d", Fraction(1, 2592000), "1/month"),
        ("1/31d", Fraction(1, 2678400), "1/2678400s"),
        ("100/year", Fraction(1, 311040), "100/year"),
    ],
)
def test_rates_not_whole_per_second_are_exact(text: str, exact: Fraction, back: str) -> None:
    """No longer refused; the exact rate, and text that reads back to it."""
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
            '"100/fortnight": unknown period "fortnight"; use second, minute, hour, day, '
            "month or year",
        ),
        (
            "100/",
            "\"100/\": missing period after '/'; use second, minute, hour, day, month or year",
        ),
        (
            "10 per",
            "\"10 per\": missing period after 'per'; use second, minute, hour, day, month or year",
        ),
        (
            "10/second;100/minute",
            '"10/second;100/minute" holds 2 limits; a policy meters one rate per (tenant, '
            "metric): write one policy per limit, each on a metric of its own, and admit "
            "against each (docs/policies.md)",
        ),
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


# The single-limit strings of the `limits` package (https://limits.readthedocs.io, "Rate
# limit string notation"), with its lengths: a month is 30 days, a year 12 such months.
_DAY = 86400


@pytest.mark.parametrize(
    "text, exact",
    [
        ("10/second", Fraction(10)),
        ("10 per second", Fraction(10)),
        ("10/Second", Fraction(10)),
        ("10 PER SECOND", Fraction(10)),
        ("10per second", Fraction(10)),
        ("10 per 10 seconds", Fraction(1)),
        ("10/10 seconds", Fraction(1)),
        ("5 per 2 Minutes", Fraction(5, 120)),
        ("100/Hour", Fraction(100, 3600)),
        ("100 per day", Fraction(100, _DAY)),
        ("100/month", Fraction(100, 30 * _DAY)),
        ("2 per 3 months", Fraction(2, 90 * _DAY)),
        ("1/year", Fraction(1, 360 * _DAY)),
        ("1000 per Years", Fraction(1000, 360 * _DAY)),
        ("1k per minute", Fraction(1000, 60)),
    ],
)
def test_the_limits_package_single_limit_strings(text: str, exact: Fraction) -> None:
    assert parse_rate("target_rate", text) == exact
    assert parse_rates("target_rate", text) == [exact]


@pytest.mark.parametrize("sep", [";", ",", "|", " ; "])
def test_several_limits_parse_into_a_list(sep: str) -> None:
    text = sep.join(["10/second", "100 per minute", "1000/day"])
    assert parse_rates("target_rate", text) == [
        Fraction(10),
        Fraction(100, 60),
        Fraction(1000, _DAY),
    ]
    assert parse_rates("target_rate", 5) == [Fraction(5)]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("10/s;;5/m", '"10/s;;5/m": limit 2 is empty'),
        ("10/s;5/fortnight", '"5/fortnight": unknown period "fortnight"'),
        (";".join(["1/s"] * (RATES_MAX + 1)), f"holds {RATES_MAX + 1} limits; at most {RATES_MAX}"),
    ],
)
def test_bad_several_limits_name_the_field_and_the_part(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_rates("target_rate", text)
    assert info.value.field == "target_rate"
    assert problem in info.value.problem


def test_a_policy_file_entry_with_several_limits_is_refused_in_one_line() -> None:
    entry = {
        "tenant_id": "acme",
        "metric": "requests",
        "generation": 1,
        "target_rate": "10/second;100/minute",
        "global_burst": 10,
        "local_burst_cap": 2,
    }
    with pytest.raises(ConfigError) as info:
        parse_policy_list([entry], where="policies")
    assert info.value.field == "policies[0].target_rate"
    assert "holds 2 limits" in str(info.value) and "\n" not in str(info.value)


def test_the_two_limits_example_in_the_docs_runs(capsys: pytest.CaptureFixture[str]) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "policies.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "parse_rates" in b]
    exec(compile(block, "docs/policies.md", "exec"), {})
    assert capsys.readouterr().out == "[10, '100/minute']\n"

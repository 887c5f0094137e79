"""The one parser of rates and amounts written as text: `"100/second"`,
`"5000/minute"`, `"1MiB/second"`, `"10 per 2 hours"`, and bursts such as `"1MiB"`.

Grammar (whitespace around the parts is ignored; sizes are case-sensitive, period names and
`per` are not):

    rate    = amount ("/" | "per") [count] period   e.g. 100/second, 1.5k/s, 10 per 2 hours
            | integer                        per second, as before (YAML 100 or "100")
    rates   = rate {("," | ";" | "|") rate}  several limits (`parse_rates`)
    amount  = number [size]                  e.g. 100, 1.5k, 1MiB
    number  = digits ["." digits]
    size    = k | M | G                      decimal: 1e3, 1e6, 1e9
            | KiB | MiB | GiB                binary: 2**10, 2**20, 2**30
    period  = ms | millisecond               (plural "s" allowed on the long names)
            | s | sec | second
            | m | min | minute
            | h | hour
            | d | day
            | month                          30 days
            | year                           360 days (12 months of 30)

Every single-limit string of the `limits` package ("10/second", "10 per second",
"10 per 2 minutes", "5/Hour") reads here to the same rate, and its month and year are
its lengths: 30 days and 12 of those. Its several-limit strings
("10/second;100/minute") read with `parse_rates`; `parse_rate` refuses them, since one
policy meters one rate (docs/policies.md says how to write two limits).

A rate is exact: `parse_rate` gives units per second as a reduced Fraction, and
`"5000/minute"` is 250/3 per second, never truncated. The mesh and governord meter in exact
integer arithmetic per second, so a policy keeps such a rate as `scale` sub-units per unit
(the Fraction's denominator, 1 for a whole rate per second) and an integer rate of sub-units
per second (its numerator): see `ratemesh.policy.TenantRatePolicy` and docs/policies.md.
`rate_text` writes a (rate, scale) pair back as text `parse_rate` reads to the same pair.
An amount must come out a whole number of units (`"1.5k"` is 1500; `"1.5"` is refused).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from ratemesh.checks import INT_MAX, check_int
from ratemesh.errors import ConfigError, RatemeshError

__all__ = [
    "PERIODS_S",
    "RATES_MAX",
    "SIZES",
    "format_rate",
    "parse_amount",
    "parse_rate",
    "parse_rates",
    "rate_text",
    "rate_window",
]

SIZES: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
}
_MONTH_S = 30 * 86400  # the `limits` package's month
_YEAR_S = 12 * _MONTH_S  # and its year: 360 days
# Period names (lower case; text is matched without case) to their length in seconds (a
# Fraction: a millisecond is 1/1000 s).
PERIODS_S: dict[str, Fraction] = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), Fraction(1, 1000)),
    **dict.fromkeys(("s", "sec", "second", "seconds"), Fraction(1)),
    **dict.fromkeys(("m", "min", "minute", "minutes"), Fraction(60)),
    **dict.fromkeys(("h", "hour", "hours"), Fraction(3600)),
    **dict.fromkeys(("d", "day", "days"), Fraction(86400)),
    **dict.fromkeys(("month", "months"), Fraction(_MONTH_S)),
    **dict.fromkeys(("year", "years"), Fraction(_YEAR_S)),
}
TEXT_MAX = 64  # longer text is certainly a mistake; the error quotes it, so keep it short
RATES_MAX = 8  # limits in one `parse_rates` text
_SEPARATORS = re.compile(r"[,;|]")
_PER = re.compile(r"(.+?)\s*per\s*(.*)", re.IGNORECASE)
_AMOUNT = re.compile(r"\s*(\d{1,19}(?:\.\d{1,9})?)\s*([A-Za-z]*)\s*")
_PERIOD_HINT = "use second, minute, hour, day, month or year"
_SIZE_HINT = "use k, M, G (decimal) or KiB, MiB, GiB (binary)"


def parse_amount(
    field: str, value: Any, *, minimum: int = 1, error: type[RatemeshError] = ConfigError
) -> int:
    """An integer, or text `number[size]` such as "1MiB", as a whole number of units."""
    if type(value) is not str:
        return check_int(field, value, minimum=minimum, error=error)
    text = _text(field, value, error)
    return _bounded(field, _amount(field, text, text, error), minimum, error, _q(text))


def parse_rate(
    field: str, value: Any, *, minimum: int = 1, error: type[RatemeshError] = ConfigError
) -> Fraction:
    """An integer (per second), or text `amount/period`, as exact units per second: a reduced
    Fraction whose numerator and denominator are each at most INT_MAX. `minimum` bounds a
    rate given as an integer or per second; a rate per period must be above zero."""
    if type(value) is not str:
        return Fraction(check_int(field, value, minimum=minimum, error=error))
    text = _text(field, value, error)
    if _SEPARATORS.search(text):
        n = len(_SEPARATORS.split(text))
        raise error(
            field,
            f"{_q(text)} holds {n} limits; a policy meters one rate per (tenant, metric): "
            "write one policy per limit, each on a metric of its own, and admit against each "
            "(docs/policies.md)",
        )
    amount_text, slash, period_text = text.partition("/")
    if not slash:
        per = _PER.fullmatch(text)
        if per is not None:
            amount_text, slash, period_text = per[1], "per", per[2]
    if not slash:
        per_s = _amount(field, text, text, error)  # "100" or "1MiB": per second
        return Fraction(_bounded(field, per_s, minimum, error, _q(text)))
    amount = _number(field, amount_text, text, error)
    period = period_text.strip()
    if not period:
        raise error(field, f"{_q(text)}: missing period after '{slash}'; {_PERIOD_HINT}")
    count, unit = _split_period(period)
    unit = unit.lower()
    if unit not in PERIODS_S:
        raise error(field, f"{_q(text)}: unknown period {_q(unit or period)}; {_PERIOD_HINT}")
    length_s = PERIODS_S[unit] * count
    if length_s == 0:
        raise error(field, f"{_q(text)}: the period must be longer than zero")
    exact = amount / length_s
    if exact.denominator == 1:
        return Fraction(_bounded(field, int(exact), minimum, error, _q(text)))
    if exact <= 0:
        raise error(field, f"{_q(text)} must be above zero")
    _bounded(field, exact.numerator, 1, error, _q(text))
    if exact.denominator > INT_MAX:
        raise error(field, f"{_q(text)}: the period is too long for its amount")
    return exact


def parse_rates(
    field: str, value: Any, *, minimum: int = 1, error: type[RatemeshError] = ConfigError
) -> list[Fraction]:
    """Several limits in one text, as the `limits` package writes them
    ("10/second;100/minute", separated by ";", "," or "|"), each as `parse_rate` reads it;
    a single rate (or an integer) is a list of one."""
    if type(value) is not str:
        return [parse_rate(field, value, minimum=minimum, error=error)]
    if len(value) > TEXT_MAX * RATES_MAX:
        raise error(field, f"must be at most {TEXT_MAX * RATES_MAX} characters, got {len(value)}")
    parts = _SEPARATORS.split(value)
    if len(parts) > RATES_MAX:
        raise error(field, f"holds {len(parts)} limits; at most {RATES_MAX}")
    out = []
    for i, part in enumerate(parts):
        if not part.strip():
            raise error(field, f"{_q(value)}: limit {i + 1} is empty")
        out.append(parse_rate(field, part.strip(), minimum=minimum, error=error))
    return out


def rate_text(rate: int, scale: int = 1) -> str:
    """`rate`/`scale` units per second as text `parse_rate` reads back exactly, in the
    period `rate_window` picks: "5000/minute", "250/7s"; a whole rate per second stays
    "N/second"."""
    amount, period_s = rate_window(rate, scale)
    name = _NAMES.get(period_s)
    return f"{amount}/{name}" if name else f"{amount}/{period_s}s"


def rate_window(rate: int, scale: int = 1) -> tuple[int, int]:
    """`rate`/`scale` units per second as (amount, period_s), both whole: the smallest
    period of second, minute, hour, day, month, year that holds a whole number of units,
    else `scale` seconds (a verdict's exact limit; the RateLimit-Policy field's q and w)."""
    for _, length in _NAMED_S:
        if length % scale == 0:
            return rate * (length // scale), length
    return rate, scale


_NAMED_S = (
    ("second", 1),
    ("minute", 60),
    ("hour", 3600),
    ("day", 86400),
    ("month", _MONTH_S),
    ("year", _YEAR_S),
)
_NAMES = {length: name for name, length in _NAMED_S}


def format_rate(per_s: int, period: str = "second") -> str:
    """`per_s` units per second written per `period` (a name `parse_rate` reads)."""
    count, unit = _split_period(period)
    length = PERIODS_S.get(unit.lower(), Fraction(1)) * count
    amount = per_s * length
    shown = str(amount.numerator) if amount.denominator == 1 else f"{float(amount):g}"
    return f'"{shown}/{period}"'


def _split_period(period: str) -> tuple[int, str]:
    """'10s' is ten seconds, 'minute' one minute."""
    m = re.fullmatch(r"(\d{0,12})\s*([A-Za-z]*)", period.strip())
    if m is None:
        return 1, period.strip()
    digits, unit = m.groups()
    return (int(digits) if digits else 1), unit


def _amount(field: str, part: str, text: str, error: type[RatemeshError]) -> int:
    amount = _number(field, part, text, error)
    if amount.denominator != 1:
        raise error(field, f"{_q(text)} is not a whole number of units")
    return int(amount)


def _number(field: str, part: str, text: str, error: type[RatemeshError]) -> Fraction:
    m = _AMOUNT.fullmatch(part)
    if m is None:
        raise error(
            field, f"{_q(text)}: expected a number with an optional size, such as 100 or 1MiB"
        )
    digits, size = m.groups()
    if size not in SIZES:
        raise error(field, f"{_q(text)}: unknown size {_q(size)}; {_SIZE_HINT}")
    return Fraction(digits) * SIZES[size]


def _text(field: str, value: str, error: type[RatemeshError]) -> str:
    if len(value) > TEXT_MAX:
        raise error(field, f"must be at most {TEXT_MAX} characters, got {len(value)}")
    if not value.strip():
        raise error(field, "must not be empty")
    return value


def _bounded(field: str, n: int, minimum: int, error: type[RatemeshError], shown: str) -> int:
    if n < minimum:
        raise error(field, f"{shown} must be >= {minimum}")
    if n > INT_MAX:
        raise error(field, f"{shown} must be <= {INT_MAX}")
    return n


def _q(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'

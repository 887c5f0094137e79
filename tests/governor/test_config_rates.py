"""Rates in governord.yaml (root and tenants): parsed into the engine's Rate, every mistake a
ConfigError naming its key (docs/strict.md)."""

from __future__ import annotations

from typing import Any

import pytest

from governor.config import ConfigError, parse_config
from governor.engine import Rate

KEY = "a" * 64


def _with(rates: Any) -> dict[str, Any]:
    return {"tenants": {"a": {"api_key_sha256": KEY, "rates": rates}}}


def test_root_and_tenant_rates_parse() -> None:
    doc = _with({"http": {"per_s": 5, "burst": 9}})
    doc["root"] = {"rates": {"http": {"per_s": 50, "burst": 90}}}
    cfg = parse_config(doc, {})
    assert cfg.tenants[0].rates == {"http": Rate(5, 9)}
    assert cfg.root_rates == {"http": Rate(50, 90)}


@pytest.mark.parametrize(
    "rates, field",
    [
        ({"http": {"per_s": 5}}, "tenants.a.rates.http.burst"),
        ({"http": {"per_s": 5, "burst": 0}}, "tenants.a.rates.http.burst"),
        ({"http": {"per_s": -1, "burst": 2}}, "tenants.a.rates.http.per_s"),
        ({"http": {"per_s": 10**10, "burst": 2}}, "tenants.a.rates.http.per_s"),
        ({"http": {"per_s": True, "burst": 2}}, "tenants.a.rates.http.per_s"),
        ({"http": [1, 2]}, "tenants.a.rates.http"),
        ({"http": {"per_s": 1, "burst": 1, "rps": 1}}, "tenants.a.rates.http.rps"),
        ([1], "tenants.a.rates"),
    ],
)
def test_rate_mistakes_name_the_key(rates: Any, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_with(rates), {})
    assert info.value.field == field

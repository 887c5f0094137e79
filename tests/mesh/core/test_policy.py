"""Policy validation, generations that never change meaning, and the default tenant."""

from __future__ import annotations

from typing import Any

import pytest

from mesh.core.policy import (
    DEFAULT_TENANT,
    Metric,
    Mode,
    PolicyCache,
    RateKey,
    TenantRatePolicy,
    Unit,
)
from mesh.errors import ConfigError, MeshError
from ratemesh import errors as shared
from tests.mesh._helpers import policy

GOOD: dict[str, Any] = dict(
    tenant_id="acme",
    metric="read_iops",
    generation=1,
    target_rate=100,
    global_burst=10,
    local_burst_cap=5,
)


def test_units_by_metric() -> None:
    assert Metric.READ_IOPS.unit is Unit.UNITS and Metric.WRITE_IOPS.unit is Unit.UNITS
    for m in (
        "client_egress_bytes",
        "origin_read_bytes",
        "client_ingress_bytes",
        "origin_write_bytes",
    ):
        assert Metric(m).unit is Unit.BYTES
    assert len(Metric) == 6


@pytest.mark.parametrize(
    "change, field, exc",
    [
        ({"target_rate": -1}, "target_rate", shared.ConfigError),
        ({"target_rate": 0}, "target_rate", shared.ConfigError),
        ({"global_burst": 0}, "global_burst", shared.ConfigError),
        ({"local_burst_cap": 0}, "local_burst_cap", shared.ConfigError),
        ({"metric": "read ops"}, "metric", shared.ConfigError),
        ({"metric": 7}, "metric", shared.ConfigTypeError),
        ({"mode": "eventual"}, "mode", shared.ConfigError),
        ({"generation": 0}, "generation", shared.ConfigError),
        ({"generation": 1.0}, "generation", shared.ConfigTypeError),
        ({"tenant_id": ""}, "tenant_id", shared.ConfigError),
        ({"tenant_id": None}, "tenant_id", shared.ConfigTypeError),
        ({"tenant_id": "x" * 1000}, "tenant_id", shared.ConfigError),
        ({"target_rate": 2**64}, "target_rate", shared.ConfigError),
        ({"target_rate": True}, "target_rate", shared.ConfigTypeError),
        ({"enabled": "yes"}, "enabled", shared.ConfigTypeError),
    ],
)
def test_bad_policy_names_the_field(
    change: dict[str, Any], field: str, exc: type[shared.ConfigError]
) -> None:
    """The model is shared with governord, so it raises the shared family."""
    with pytest.raises(exc) as info:
        TenantRatePolicy(**{**GOOD, **change})
    assert info.value.field == field


def test_a_bad_metric_name_error_states_the_rule() -> None:
    # The vocabulary is open: any name the rule allows is a metric.
    assert TenantRatePolicy(**{**GOOD, "metric": "iops"}).metric == "iops"
    with pytest.raises(shared.ConfigError, match="lowercase letters, digits and '_'"):
        TenantRatePolicy(**{**GOOD, "metric": "IOPS"})


@pytest.mark.parametrize(
    "data, field",
    [
        ({**GOOD, "rate": 5}, "policies[0].rate"),
        ({k: v for k, v in GOOD.items() if k != "global_burst"}, "policies[0].global_burst"),
        ({**GOOD, "target_rate": -3}, "policies[0].target_rate"),
        ("not a mapping", "policies[0]"),
    ],
)
def test_from_dict_names_where(data: object, field: str) -> None:
    with pytest.raises(MeshError) as info:
        TenantRatePolicy.from_dict(data, where="policies[0]", error=ConfigError)
    assert info.value.field == field


def test_round_trip_dict() -> None:
    p = TenantRatePolicy.from_dict({**GOOD, "mode": "share", "enabled": False})
    assert TenantRatePolicy.from_dict(p.to_dict()) == p
    assert p.mode is Mode.SHARE and p.rate_key == RateKey("acme", Metric.READ_IOPS, 1)


def test_generation_is_immutable_and_changes_nothing_on_conflict() -> None:
    c = PolicyCache([policy("a", rate=10)])
    version = c.version
    assert not c.put(policy("a", rate=10))  # the same generation again: a no-op
    with pytest.raises(ConfigError, match="new generation"):
        c.put(policy("a", rate=20))
    with pytest.raises(ConfigError):
        c.put_all([policy("b"), policy("a", rate=30)])  # all or none
    assert c.current("b", Metric.READ_IOPS) is None
    assert c.version == version and c.current("a", Metric.READ_IOPS).target_rate == 10  # type: ignore[union-attr]


def test_newest_generation_is_current_and_old_ones_stay_resolvable() -> None:
    c = PolicyCache([policy("a", gen=1), policy("a", gen=3, rate=5)])
    c.put(policy("a", gen=2, rate=7))
    cur = c.current("a", Metric.READ_IOPS)
    assert cur is not None and cur.generation == 3
    assert c.get(RateKey("a", Metric.READ_IOPS, 2)).target_rate == 7  # type: ignore[union-attr]
    assert c.get(RateKey("a", Metric.READ_IOPS, 9)) is None


def test_default_tenant_applies_to_tenants_without_their_own() -> None:
    c = PolicyCache([policy(DEFAULT_TENANT, rate=50), policy("vip", rate=500)])
    other = c.current("someone", Metric.READ_IOPS)
    assert other is not None and other.tenant_id == "someone" and other.target_rate == 50
    assert c.get(other.rate_key) == other
    assert c.current("vip", Metric.READ_IOPS).target_rate == 500  # type: ignore[union-attr]
    # The vip has its own policies: the default's generation does not resolve for it.
    assert c.get(RateKey("vip", Metric.READ_IOPS, 1)).target_rate == 500  # type: ignore[union-attr]
    assert c.current("someone", Metric.CLIENT_EGRESS_BYTES) is None


def test_a_removal_falls_back_to_the_default_and_keeps_old_generations_resolvable() -> None:
    c = PolicyCache([policy("a", gen=1, rate=10), policy(DEFAULT_TENANT, gen=1, rate=99)])
    assert c.remove("a", Metric.READ_IOPS, 2)
    fallback = c.current("a", Metric.READ_IOPS)
    assert fallback is not None and fallback.target_rate == 99  # the default tenant's, now
    assert c.get(RateKey("a", Metric.READ_IOPS, 1)).target_rate == 10  # type: ignore[union-attr]
    version = c.version
    assert not c.remove("a", Metric.READ_IOPS, 2)  # the same tombstone again: nothing
    assert not c.put(policy("a", gen=1, rate=10)) and c.version == version
    c.put(policy("a", gen=3, rate=5))  # a put newer than the removal is current again
    assert c.current("a", Metric.READ_IOPS).target_rate == 5  # type: ignore[union-attr]
    assert not c.remove("a", Metric.READ_IOPS, 2)  # an older tombstone changes nothing

"""An open vocabulary: metric names declared by policy with a unit, rates as
text, descriptors under the tenant. Old files (the six seed-004 names, integer rates, no
unit) load unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mesh.core.policy import PolicyCache
from mesh.errors import ConfigError as MeshConfigError
from ratemesh.errors import ConfigError
from ratemesh.policy import (
    DESCRIPTOR_SEP,
    METRICS_MAX,
    Metric,
    Mode,
    RateKey,
    TenantRatePolicy,
    Unit,
    check_metric,
    descriptor_tenant,
    split_tenant,
)
from ratemesh.policyfile import load_policy_file, parse_policy_list

P: dict[str, Any] = {
    "tenant_id": "acme",
    "metric": "requests",
    "generation": 1,
    "target_rate": "100/second",
    "global_burst": 50,
    "local_burst_cap": 5,
}


def pol(**kw: Any) -> TenantRatePolicy:
    return TenantRatePolicy.from_dict({**P, **kw})


# -- metric names and units -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["requests", "tokens", "usd_micros", "a", "x" * 63, "gpu_s2"])
def test_any_name_the_rule_allows_is_a_metric(name: str) -> None:
    assert check_metric(name) == name and type(check_metric(name)) is str
    assert pol(metric=name).rate_key == RateKey("acme", name, 1)


@pytest.mark.parametrize(
    "name", ["", "Requests", "2xx", "_x", "a-b", "a b", "x" * 64, "é", "a\x00", "read.iops"]
)
def test_a_name_outside_the_rule_is_refused_naming_the_field(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        pol(metric=name)
    assert info.value.field == "policy.metric"
    assert "lowercase letters, digits and '_'" in info.value.problem


def test_the_seed_names_are_constants_and_compare_as_their_names() -> None:
    p = pol(metric=Metric.CLIENT_EGRESS_BYTES)
    assert p.metric == "client_egress_bytes" and type(p.metric) is str
    by_name: dict[str, int] = {Metric.READ_IOPS: 1}
    assert by_name["read_iops"] == 1


@pytest.mark.parametrize(
    "metric, unit",
    [
        ("read_iops", Unit.REQUESTS),
        ("client_egress_bytes", Unit.BYTES),
        ("upload_bytes", Unit.BYTES),
        ("requests", Unit.REQUESTS),
        ("tokens", Unit.REQUESTS),  # a name alone says requests; a policy says tokens
    ],
)
def test_the_unit_defaults_from_the_name(metric: str, unit: Unit) -> None:
    assert pol(metric=metric).unit is unit


def test_units_is_read_as_requests() -> None:
    assert pol(unit="units").unit is Unit.REQUESTS and Unit("units") is Unit.REQUESTS
    assert Unit["UNITS"] is Unit.REQUESTS
    assert pol(unit="tokens").unit is Unit.TOKENS
    with pytest.raises(ConfigError) as info:
        pol(unit="furlongs")
    assert info.value.field == "policy.unit"


def test_a_policy_round_trips_and_a_seed_policy_maps_as_before() -> None:
    old = {**P, "metric": "read_iops", "target_rate": 100}
    p = TenantRatePolicy.from_dict(old)
    assert p.to_dict() == {**old, "enabled": True, "mode": "global"}  # no unit, no descriptor
    q = pol(metric="tokens", unit="tokens", descriptor={"route": "/v1/chat"})
    d = q.to_dict()
    assert d["unit"] == "tokens" and d["descriptor"] == {"route": "/v1/chat"}
    assert d["tenant_id"] == "acme" and TenantRatePolicy.from_dict(d) == q


def test_rates_and_bursts_as_text_are_kept_as_integers() -> None:
    p = pol(
        metric="egress_bytes",
        target_rate="1MiB/second",
        global_burst="4MiB",
        local_burst_cap="256KiB",
    )
    assert (p.target_rate, p.global_burst, p.local_burst_cap) == (1 << 20, 4 << 20, 256 << 10)
    assert pol(target_rate="6000/minute").target_rate == 100
    assert pol(target_rate="6000/minute") == pol(target_rate=100)  # one generation, one meaning


def test_a_bad_rate_in_a_file_names_the_entry_field_and_text(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump([{**P, "target_rate": "100/fortnight"}]))
    with pytest.raises(ConfigError) as info:
        load_policy_file(f)
    assert str(info.value) == (
        'policies[0].target_rate: "100/fortnight": unknown period "fortnight"; '
        "use second, minute, hour, day, month or year"
    )


def test_an_old_file_loads_unchanged(tmp_path: Path) -> None:
    old = [
        {**P, "metric": m.value, "target_rate": 100, "global_burst": 10}
        for m in Metric  # the six seed-004 names, integer rates, no unit
    ]
    f = tmp_path / "old.yaml"
    f.write_text(yaml.safe_dump({"policies": old}))
    loaded = [d.policy for d in load_policy_file(f)]
    assert [p.to_dict() for p in loaded] == [{**o, "enabled": True, "mode": "global"} for o in old]
    assert [p.unit for p in loaded] == [Metric(o["metric"]).unit for o in old]


def test_two_policies_with_one_metric_in_two_units_are_refused_naming_both() -> None:
    a = {**P, "metric": "llm", "unit": "tokens"}
    b = {**P, "tenant_id": "beta", "metric": "llm", "unit": "usd_micros"}
    with pytest.raises(ConfigError) as info:
        parse_policy_list([a, b], where="policies")
    assert str(info.value) == (
        "policies.unit: metric 'llm' is counted in tokens by acme/llm generation 1 and in "
        "usd_micros by beta/llm generation 1; a metric has one unit"
    )
    cache = PolicyCache([TenantRatePolicy.from_dict(a)])
    with pytest.raises(MeshConfigError, match="counted in tokens by acme/llm"):
        cache.put(TenantRatePolicy.from_dict(b))
    with pytest.raises(MeshConfigError, match="a metric has one unit"):
        PolicyCache([TenantRatePolicy.from_dict(a), TenantRatePolicy.from_dict(b)])
    # The same scope may change its unit in a new generation while nothing else names it.
    cache.put(TenantRatePolicy.from_dict({**a, "generation": 2, "unit": "usd_micros"}))
    assert cache.current("acme", "llm").unit is Unit.USD_MICROS  # type: ignore[union-attr]


def test_a_cache_holds_at_most_metrics_max_names() -> None:
    cache = PolicyCache([pol(metric=f"m{i}") for i in range(METRICS_MAX)])
    with pytest.raises(MeshConfigError, match="METRICS_MAX"):
        cache.put(pol(metric="one_more"))
    assert cache.current("acme", "one_more") is None
    cache.put(pol(metric="m0", generation=2))  # a declared name takes new generations


# -- descriptors ------------------------------------------------------------------------------


def test_a_descriptor_folds_into_the_tenant_part_unambiguously() -> None:
    t = descriptor_tenant("acme", ("route", "/upload"))
    assert t == f"acme{DESCRIPTOR_SEP}route=/upload"
    assert descriptor_tenant("acme", {"route": "/upload"}) == t
    assert descriptor_tenant("acme", "route=/upload") == t
    assert split_tenant(t) == ("acme", ("route", "/upload"))
    assert split_tenant("acme") == ("acme", None)
    assert split_tenant(descriptor_tenant("acme", ("q", "a=b"))) == ("acme", ("q", "a=b"))
    p = pol(descriptor={"route": "/upload"})
    assert p.rate_key == RateKey(t, "requests", 1) and p.tenant == "acme"
    assert p.descriptor == ("route", "/upload")
    assert TenantRatePolicy.from_dict({**P, "tenant_id": t}) == p


@pytest.mark.parametrize(
    "descriptor, field, problem",
    [
        ({"route": "/a", "op": "get"}, "policy.descriptor", "must hold exactly one key"),
        ({"Route": "/a"}, "policy.descriptor", "key 'Route' must be lowercase"),
        ({"route": ""}, "policy.descriptor.route", "must be a non-empty string"),
        ({"route": {"deeper": "x"}}, "policy.descriptor.route", "must be a non-empty string"),
        ({"route": "a\nb"}, "policy.descriptor.route", "must be printable"),
        ({"route": "x" * 129}, "policy.descriptor.route", "at most 128 characters"),
        ("route", "policy.descriptor", "must be written key=value"),
    ],
)
def test_a_bad_descriptor_names_the_field(descriptor: Any, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        pol(descriptor=descriptor)
    assert info.value.field == field and problem in info.value.problem, info.value


def test_a_descriptor_resolves_most_specific_first() -> None:
    plain = pol(target_rate=100)
    upload = pol(target_rate=10, descriptor={"route": "/upload"})
    any_route = pol(target_rate=20, descriptor={"route": "*"})
    every_tenant_get = pol(tenant_id="*", target_rate=30, descriptor={"op": "get"})
    cache = PolicyCache([plain, upload, any_route, every_tenant_get])

    def current(tenant: str, d: tuple[str, str]) -> TenantRatePolicy | None:
        return cache.current(descriptor_tenant(tenant, d), "requests")

    assert current("acme", ("route", "/upload")) == upload  # its own policy
    other = current("acme", ("route", "/search"))  # the tenant's route default...
    assert other is not None and other.target_rate == 20
    assert other.rate_key.tenant_id == descriptor_tenant("acme", ("route", "/search"))  # own key
    get = current("beta", ("op", "get"))  # the default tenant's entry, its own bucket
    assert get is not None and get.target_rate == 30
    assert get.rate_key.tenant_id == descriptor_tenant("beta", ("op", "get"))
    fallback = current("acme", ("op", "put"))  # nothing for op=put: the tenant's plain one
    assert fallback == plain and fallback.rate_key.tenant_id == "acme"
    assert current("beta", ("route", "/x")) is None  # beta has no policy at all
    # Owners resolve the keys the same way, by generation.
    assert cache.get(other.rate_key) == other and cache.get(get.rate_key) == get
    assert cache.get(RateKey(descriptor_tenant("acme", ("route", "/x")), "requests", 9)) is None


def test_put_all_refuses_a_unit_conflict_with_the_cache_and_changes_nothing() -> None:
    llm = pol(metric="llm", unit="tokens")
    cache = PolicyCache([llm])
    before = cache.version
    batch = [pol(tenant_id="beta", metric="requests"), pol(tenant_id="gamma", metric="llm")]
    with pytest.raises(MeshConfigError, match="a metric has one unit"):
        cache.put_all(batch)  # gamma/llm says requests (the name's default)
    assert cache.version == before and cache.current("beta", "requests") is None
    many = [pol(metric=f"m{i}") for i in range(METRICS_MAX)]
    with pytest.raises(MeshConfigError, match="METRICS_MAX"):
        cache.put_all(many)
    assert cache.version == before


def test_redis_mode_refuses_units_that_are_refunded() -> None:
    """Bytes and tokens are charged ahead and refunded on a short send; redis's script only
    takes, so the refund would be lost and the limit silently tighter: refused, naming it."""
    for metric, unit in (("client_egress_bytes", None), ("llm", Unit.TOKENS)):
        with pytest.raises(ConfigError, match="redis cannot meter") as e:
            TenantRatePolicy(
                "t",
                metric,
                1,
                target_rate=100,
                global_burst=10,
                local_burst_cap=5,
                mode=Mode.REDIS,
                unit=unit,  # type: ignore[arg-type]  # None: the name's
            )
        assert "mode" in str(e.value)
    ok = TenantRatePolicy(
        "t", "read_iops", 1, target_rate=100, global_burst=10, local_burst_cap=5, mode=Mode.REDIS
    )
    assert ok.mode == "redis"


def test_a_written_spend_quota_refuses_a_mode() -> None:
    """A quota's ledger meters it whatever the mode says: a mode written beside it would be
    read as doing something, so a policy file or node config refuses it; the wire, which
    older peers write with a mode, still reads it."""
    q = {"tenant_id": "t", "metric": "llm", "generation": 1, "period": "day", "quota": 1000}
    with pytest.raises(ConfigError, match=r"policy\.mode: does not apply to a spend quota"):
        TenantRatePolicy.from_dict({**q, "mode": "local"}, written=True)
    assert TenantRatePolicy.from_dict({**q, "mode": "global"}).quota == 1000
    written = TenantRatePolicy.from_dict(q, written=True)
    assert "mode" not in written.to_dict()
    assert TenantRatePolicy.from_dict(written.to_dict(), written=True) == written

"""The `envoy_rls` key beyond envoyproxy/ratelimit's own test files (those are in
tests/mesh/sidecar/test_envoy_conformance.py): what it builds and what it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mesh.config import bucket_tenant, parse_config
from mesh.errors import ConfigError
from ratemesh.policy import split_tenant


def _config(tmp: Path, rules: str, **envoy: Any) -> Any:
    (tmp / "rules.yaml").write_text(rules)
    return parse_config(
        {
            "sidecar": {"grpc_listen": "127.0.0.1:0"},
            "envoy_rls": {"config_files": ["rules.yaml"], **envoy},
        },
        base=tmp,
    )


RULES = """\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: code
    value: 200
    rate_limit: {unit: year, requests_per_unit: 0}
"""


def test_each_rule_is_a_policy_named_by_its_stats_key(tmp_path: Path) -> None:
    cfg = _config(tmp_path, RULES, mode="local")
    (policy,) = cfg.policies  # a rule of 0 a unit meters nothing: every request is over
    assert split_tenant(policy.tenant_id) == ("envoy:edge.remote_address", ("v", "*"))
    assert (policy.metric, policy.mode.value, policy.limit_per_s) == ("envoy_requests", "local", 1)
    assert policy.burst_units == 60
    root = cfg.envoy_rls.domains["edge"]
    assert root.children["code_200"].limit.policy is None  # a YAML number is its text
    lim = root.children["remote_address"].limit
    assert bucket_tenant(lim, ["10.0.0.1"]).endswith("\x1ev=10.0.0.1")
    # values that would read alike joined, or too long for a descriptor value: a digest each
    one, two = bucket_tenant(lim, ["a,b", "c"]), bucket_tenant(lim, ["a", "b,c"])
    assert one != two and "#" in one
    assert "#" in bucket_tenant(lim, ["x" * 500])


@pytest.mark.parametrize(
    ("extra", "rules", "says"),
    [
        ({}, RULES.replace("minute", "fortnight"), "invalid rate limit unit 'fortnight'"),
        ({"mode": "fast"}, RULES, "envoy_rls.mode"),
        ({}, RULES + "  - key: q\n    quota_mode: true\n", "quota_mode"),
        ({}, "domain: edge\ndescriptors: 3\n", "must be a list of descriptors"),
        ({}, "- 1\n", "must be a mapping"),
    ],
)
def test_a_bad_rule_or_key_is_one_error(
    tmp_path: Path, extra: dict[str, Any], rules: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=r"envoy_rls") as info:
        _config(tmp_path, rules, **extra)
    assert says in str(info.value)


def test_the_rules_need_the_sidecars_grpc_port(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    with pytest.raises(ConfigError, match="sidecar.grpc_listen"):
        parse_config({"envoy_rls": {"config_files": ["rules.yaml"]}}, base=tmp_path)

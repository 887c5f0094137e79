"""governord's config: keys by environment variable or SHA-256, never in clear text; errors name
the key; defaults with no file at all."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from governor.config import ConfigError, default_config, is_loopback, parse_config

KEY_A, KEY_C, KEY_W = "tenant-a-key-5d1e8f", "coordinator-key-2b7c", "worker-key-9a4f3e"


def test_keys_by_env_or_hash_and_defaults() -> None:
    digest = hashlib.sha256(b"secret-b").hexdigest()
    cfg = parse_config(
        {
            "tenants": {
                "a": {"api_key_env": "K_A", "weight": 3, "quotas": {"http": 10}},
                "b": {"api_key_sha256": digest, "defaults": {"quotas": {"retry": 2}}},
            },
            "root": {"limits": {"db": 20}},
            "adaptive": {
                "db": {"initial_limit": 5, "min_limit": 1, "max_limit": 9, "target_p95_ms": 100}
            },
        },  # fmt: skip
        env={"K_A": "secret-of-tenant-a-71c4"},
    )
    a, b = cfg.tenants
    assert a.key_sha256 == hashlib.sha256(b"secret-of-tenant-a-71c4").hexdigest() and a.weight == 3
    assert b.key_sha256 == digest and b.defaults is not None
    assert b.defaults.quotas == (("retry", 2),)
    assert cfg.root_limits == {"db": 20} and cfg.adaptive["db"].max_limit == 9
    assert "secret-of-tenant-a-71c4" not in repr(cfg)  # the clear key is never kept
    d = default_config()
    assert d.listen == ("127.0.0.1:7443",) and d.store_kind() == ("sqlite", "governor.db")


def test_shared_keys_and_plaintext_are_refused() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(
            {"tenants": {"a": {"api_key_env": "K"}, "b": {"api_key_env": "K"}}},
            env={"K": "key-of-two-tenants-3e9a"},
        )
    assert e.value.key == "tenants.b"
    with pytest.raises(ConfigError) as e:
        parse_config({"listen": ["127.0.0.1:1", "10.0.0.1:2"]}, env={})
    assert e.value.key == "listen[1]"
    assert parse_config({"listen": "10.0.0.1:2", "allow_plaintext": True}, env={}).allow_plaintext
    assert is_loopback("[::1]:7443") and is_loopback("localhost:1") and not is_loopback("0.0.0.0:1")


def test_coordinator_keys_scopes_and_bootstrap_file(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    policy = {"tenant_id": "acme", "metric": "read_iops", "generation": 2}
    path.write_text(
        json.dumps([{**policy, "target_rate": 5, "global_burst": 2, "local_burst_cap": 1}])
    )
    cfg = parse_config(
        {
            "tenants": {"a": {"api_key_env": "K_A"}},
            "coordinator": {
                "policies_file": str(path),
                "keys": {
                    "deploy": {"api_key_env": "K_C", "scope": "coordinator"},
                    "nodes": {"api_key_env": "K_W", "scope": "worker"},
                },
            },
        },
        env={"K_A": KEY_A, "K_C": KEY_C, "K_W": KEY_W},
    )
    assert [(k.name, k.scope) for k in cfg.coordinator.keys] == [
        ("deploy", "coordinator"),
        ("nodes", "worker"),
    ]
    assert [(p.tenant_id, p.generation) for p in cfg.coordinator.bootstrap] == [("acme", 2)]
    bad: list[tuple[dict[str, Any], str]] = [
        ({"keys": {"x": {"api_key_env": "K_C", "scope": "admin"}}}, "coordinator.keys.x.scope"),
        ({"keys": {"x": {"api_key_env": "K_A", "scope": "worker"}}}, "coordinator.keys.x"),
        ({"keys": {"x": {"scope": "worker"}}}, "coordinator.keys.x.api_key_env"),
        ({"policies_file": str(tmp_path / "none.yaml")}, "coordinator.policies_file"),
        ({"polices_file": "x"}, "coordinator.polices_file"),
    ]
    path.write_text(
        json.dumps([{**policy, "target_rate": 0, "global_burst": 2, "local_burst_cap": 1}])
    )
    bad.append(({"policies_file": str(path)}, "coordinator.policies_file[0].target_rate"))
    for section, key in bad:
        with pytest.raises(ConfigError) as e:
            parse_config(
                {"tenants": {"a": {"api_key_env": "K_A"}}, "coordinator": section},
                env={"K_A": KEY_A, "K_C": KEY_C},
            )
        assert e.value.key == key, (section, str(e.value))


def test_ha_settings_need_postgresql_and_a_renewal_well_inside_the_lease() -> None:
    pg = "postgresql://127.0.0.1/test"
    cfg = parse_config({"store": pg}, env={})
    assert (cfg.ha.lease_ms, cfg.ha.renew_ms, cfg.ha.advertise) == (1500, 250, None)
    cfg = parse_config(
        {"store": pg, "ha": {"lease_ms": 900, "renew_ms": 300, "advertise": "gov-1:7443"}}, env={}
    )
    assert (cfg.ha.lease_ms, cfg.ha.renew_ms, cfg.ha.advertise) == (900, 300, "gov-1:7443")
    with pytest.raises(ConfigError, match="^ha: standbys need a postgresql store"):
        parse_config({"store": "sqlite:/tmp/g.db", "ha": {}}, env={})
    with pytest.raises(ConfigError, match="^ha.renew_ms: must be at most a third"):
        parse_config({"store": pg, "ha": {"lease_ms": 900, "renew_ms": 301}}, env={})
    with pytest.raises(ConfigError, match="^ha.lease_ms"):
        parse_config({"store": pg, "ha": {"lease_ms": 10}}, env={})
    with pytest.raises(ConfigError, match="^ha.lease: unknown key"):
        parse_config({"store": pg, "ha": {"lease": 900}}, env={})

"""The `strict:` section of a node's config: where strict limits get governord credit. Every
mistake is one ConfigError naming the key; the API key never appears in the config's repr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mesh.config import parse_config
from mesh.errors import ConfigError
from ratemesh.credit import CreditConfig
from tests.mesh._util import mesh_validate

ADDR = "127.0.0.1:7443"


def test_a_full_section_is_read_and_the_key_stays_out_of_repr(tmp_path: Path) -> None:
    (tmp_path / "tenant.key").write_text("the-tenant-key\n")
    cfg = parse_config(
        {
            "strict": {
                "governord": ADDR,
                "api_key_file": "tenant.key",
                "node": 12,
                "nodes": {"acme": 14},
                "session_ttl_ms": 5000,
                "credit": {"horizon_ms": 200, "lead_ms": 100},
            }
        },
        base=tmp_path,
    )
    s = cfg.strict
    assert s is not None and s.api_key == "the-tenant-key" and s.session_ttl_ms == 5000
    assert (s.node_for("acme"), s.node_for("other")) == (14, 12)
    assert s.credit == CreditConfig(horizon_ms=200, lead_ms=100)
    assert "the-tenant-key" not in repr(cfg)


def test_without_a_node_the_keys_own_tenant_node_is_used(monkeypatch: Any) -> None:
    monkeypatch.setenv("TENANT_KEY", "k")
    cfg = parse_config({"strict": {"governord": ADDR, "api_key_env": "TENANT_KEY"}})
    assert cfg.strict is not None and cfg.strict.node_for("acme") is None


@pytest.mark.parametrize(
    "section, field",
    [
        ([], "strict"),
        ({"api_key_env": "TENANT_KEY"}, "strict.governord"),
        ({"governord": "nowhere"}, "strict.governord"),
        ({"governord": ADDR}, "strict.api_key_file"),
        ({"governord": ADDR, "api_key_env": "UNSET_VAR_X"}, "strict.api_key_env"),
        ({"governord": ADDR, "api_key_file": "none.key"}, "strict.api_key_file"),
        ({"governord": ADDR, "api_key_env": "TENANT_KEY", "node": 0}, "strict.node"),
        ({"governord": ADDR, "api_key_env": "TENANT_KEY", "node": "12"}, "strict.node"),
        ({"governord": ADDR, "api_key_env": "TENANT_KEY", "nodes": [1]}, "strict.nodes"),
        (
            {"governord": ADDR, "api_key_env": "TENANT_KEY", "nodes": {"acme": -1}},
            "strict.nodes.acme",
        ),
        ({"governord": ADDR, "api_key_env": "TENANT_KEY", "ca": "none.pem"}, "strict.ca"),
        (
            {"governord": ADDR, "api_key_env": "TENANT_KEY", "session_ttl_ms": 5},
            "strict.session_ttl_ms",
        ),
        (
            {"governord": ADDR, "api_key_env": "TENANT_KEY", "credit": {"rho_ppm": -1}},
            "strict.credit.rho_ppm",
        ),
        (
            {"governord": ADDR, "api_key_env": "TENANT_KEY", "credit": {"speed": 1}},
            "strict.credit.speed",
        ),
        ({"governord": ADDR, "api_key_env": "TENANT_KEY", "api_key": "x"}, "strict.api_key"),
    ],
)
def test_mistakes_name_the_key(section: Any, field: str, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("TENANT_KEY", "k")
    with pytest.raises(ConfigError) as info:
        parse_config({"strict": section}, base=tmp_path)
    assert info.value.field == field, str(info.value)
    assert "\n" not in str(info.value)


def test_validate_warns_of_a_strict_policy_without_credit_and_refuses_a_bad_section(
    tmp_path: Path,
) -> None:
    policy = {
        "tenant_id": "acme",
        "metric": "read_iops",
        "generation": 1,
        "mode": "strict",
        "target_rate": 10,
        "global_burst": 10,
        "local_burst_cap": 10,
    }
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"member_id": "a", "policies": {"inline": [policy]}}))
    out = mesh_validate(config)
    assert out.returncode == 0 and "strict: a strict-mode policy" in out.stdout
    config.write_text(yaml.safe_dump({"member_id": "a", "strict": {"governord": ADDR}}))
    out = mesh_validate(config)
    assert out.returncode != 0 and "strict.api_key_file" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def _strict_policy(rate: int, burst: int) -> dict[str, Any]:
    return {
        "tenant_id": "t",
        "metric": "read_iops",
        "generation": 1,
        "mode": "strict",
        "target_rate": rate,
        "global_burst": burst,
        "local_burst_cap": burst,
    }


def _findings(tmp_path: Path, credit: dict[str, Any], rate: int, burst: int) -> list[str]:
    (tmp_path / "tenant.key").write_text("the-tenant-key\n")
    cfg = parse_config(
        {
            "policies": {"inline": [_strict_policy(rate, burst)]},
            "strict": {"governord": ADDR, "api_key_file": "tenant.key", "credit": credit},
        },
        base=tmp_path,
    )
    return [w for w in cfg.warnings() if "read_iops" in w]


def test_validate_says_when_a_strict_config_cannot_serve_its_bucket(tmp_path: Path) -> None:
    """One line per finding, naming the setting and what would do: a fixed lead far past
    B / R, a burst share that leaves no room, a B / R under a round trip; the defaults at
    B / R from 50 ms up say nothing."""
    (lead,) = _findings(tmp_path, {"lead_ms": 250}, 2_000, 100)
    assert lead.startswith("strict.credit.lead_ms:") and "set it <= " in lead
    (share,) = _findings(tmp_path, {"burst_share_ppm": 1_000_000}, 2_000, 4_000)
    assert share.startswith("strict.credit.burst_share_ppm:")
    (short,) = _findings(tmp_path, {}, 2_000, 10)
    assert "a burst of at least" in short and "B/R of 5 ms" in short
    for burst in (100, 200, 1_000, 4_000):
        assert _findings(tmp_path, {}, 2_000, burst) == []
    assert _findings(tmp_path, {"lead_ms": 20}, 2_000, 100) == []

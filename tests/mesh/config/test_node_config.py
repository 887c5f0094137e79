"""The node config: errors name the key, warnings say what is risky, identity says where
it came from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mesh.config import NodeConfig, load_config, parse_config, resolve_identity
from mesh.errors import ConfigError

POLICY = {"tenant_id": "acme", "metric": "read_iops", "generation": 1, "target_rate": 10,
          "global_burst": 5, "local_burst_cap": 2}


@pytest.mark.parametrize("data, field", [
    ({"listen": "nope"}, "listen"),
    ({"lisen": "127.0.0.1:1"}, "lisen"),
    ({"max_message_bytes": 10}, "max_message_bytes"),
    ({"allow_plaintext": "yes"}, "allow_plaintext"),
    ({"membership": {"source": "consul"}}, "membership.source"),
    ({"membership": {"source": "static"}}, "membership.members"),
    ({"membership": {"source": "etcd"}}, "membership.endpoints"),
    ({"membership": {"source": "etcd", "endpoints": ["127.0.0.1:2379"]}},
     "membership.endpoints[0]"),
    ({"membership": {"source": "static", "members": {"a": "x"}}}, "membership.members.a"),
    ({"policies": {"inline": [dict(POLICY, target_rate=0)]}}, "policies.inline[0].target_rate"),
    ({"policies": {"inline": [dict(POLICY, colour="red")]}}, "policies.inline[0].colour"),
    ({"policies": {"coordinator": {}}}, "policies.coordinator.addr"),
    ({"core": {"sync_interval_ms": 0}}, "core.sync_interval_ms"),
    ({"tls": {"cert": "/nonexistent.pem", "key": "/nonexistent.key"}}, "tls.cert"),
    ({"listen": "10.1.2.3:7000"}, "listen"),  # plaintext on a non-loopback address
    ({"membership": {"source": "static", "members": {"a": "10.0.0.9:1"}}},
     "membership.members.a"),
])
def test_errors_name_the_key(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert err.value.field == field, str(err.value)


def test_plaintext_allowed_explicitly_is_a_warning() -> None:
    cfg = parse_config({"listen": "10.1.2.3:7000", "allow_plaintext": True, "member_id": "a",
                        "policies": {"inline": [POLICY]}})
    assert any("without tls" in w for w in cfg.warnings())


def test_share_without_membership_warns() -> None:
    cfg = parse_config({"member_id": "a",
                        "policies": {"inline": [dict(POLICY, mode="share")]}})
    assert any("share-mode" in w for w in cfg.warnings())


def test_identity_order() -> None:
    assert resolve_identity(NodeConfig(member_id="x"), {}).source == "config"
    ident = resolve_identity(NodeConfig(member_id_env="POD"), {"POD": "pod-1"})
    assert (ident.member_id, ident.source, ident.stable) == ("pod-1", "env", True)
    ident = resolve_identity(NodeConfig(member_id_env="POD"), {})
    assert ident.source in ("hostname", "nonce")
    assert ident.stable is (ident.source == "hostname")


def test_policy_file_is_resolved_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "policies.yaml").write_text(json.dumps({"policies": [POLICY]}))
    (tmp_path / "node.yaml").write_text("member_id: a\npolicies: {file: policies.yaml}\n")
    cfg = load_config(tmp_path / "node.yaml")
    assert [p.tenant_id for p in cfg.policies] == ["acme"]


def test_mesh_validate_cli(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("member_id: a\nlisten: 10.0.0.1:7000\nallow_plaintext: true\n"
                    f"policies: {{inline: [{json.dumps(POLICY)}]}}\n")
    out = subprocess.run([sys.executable, "-m", "mesh.cli", "validate", "--config", str(good),
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["ok"] and res["identity"] == {"member_id": "a", "source": "config",
                                             "stable": True}
    assert any("without tls" in w for w in res["warnings"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("membership: {source: static}\n")
    out = subprocess.run([sys.executable, "-m", "mesh.cli", "validate", "--config", str(bad),
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert json.loads(out.stdout)["field"] == "membership.members"


def test_a_node_resends_reports_late_unless_told_otherwise(tmp_path: Path) -> None:
    from mesh.config import NODE_RETRY_MAX_MS, load_config

    base = {"member_id": "a", "listen": "127.0.0.1:0",
            "policies": {"inline": [{"tenant_id": "t", "metric": "read_iops", "generation": 1,
                                     "target_rate": 10, "global_burst": 10,
                                     "local_burst_cap": 1}]}}
    for core, want in (({}, NODE_RETRY_MAX_MS), ({"report_retry_max_ms": 40}, 40),
                       ({"report_retry_ms": 2000}, 2000)):
        path = tmp_path / "n.yaml"
        path.write_text(yaml.safe_dump(dict(base, core=core)))
        assert load_config(path).core.report_retry_max_ms == want

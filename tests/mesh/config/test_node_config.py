"""The node config: errors name the key, warnings say what is risky, identity says where
it came from."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mesh.config import Identity, NodeConfig, load_config, parse_config, resolve_identity
from mesh.errors import ConfigError
from tests.mesh._util import mesh_validate

POLICY = {
    "tenant_id": "acme",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 10,
    "global_burst": 5,
    "local_burst_cap": 2,
}


@pytest.mark.parametrize(
    "data, field",
    [
        ({"listen": "nope"}, "listen"),
        ({"lisen": "127.0.0.1:1"}, "lisen"),
        ({"max_message_bytes": 10}, "max_message_bytes"),
        ({"allow_plaintext": "yes"}, "allow_plaintext"),
        ({"membership": {"source": "consul"}}, "membership.source"),
        ({"membership": {"source": "static"}}, "membership.members"),
        ({"membership": {"source": "etcd"}}, "membership.endpoints"),
        (
            {"membership": {"source": "etcd", "endpoints": ["127.0.0.1:2379"]}},
            "membership.endpoints[0]",
        ),
        ({"membership": {"source": "static", "members": {"a": "x"}}}, "membership.members.a"),
        ({"policies": {"inline": [dict(POLICY, target_rate=0)]}}, "policies.inline[0].target_rate"),
        ({"policies": {"inline": [dict(POLICY, colour="red")]}}, "policies.inline[0].colour"),
        ({"policies": {"coordinator": {}}}, "policies.coordinator.addr"),
        ({"core": {"sync_interval_ms": 0}}, "core.sync_interval_ms"),
        ({"tls": {"cert": "/nonexistent.pem", "key": "/nonexistent.key"}}, "tls.cert"),
        ({"listen": "10.1.2.3:7000"}, "listen"),  # plaintext on a non-loopback address
        (
            {"membership": {"source": "static", "members": {"a": "10.0.0.9:1"}}},
            "membership.members.a",
        ),
    ],
)
def test_errors_name_the_key(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert err.value.field == field, str(err.value)


def test_plaintext_allowed_explicitly_is_a_warning() -> None:
    cfg = parse_config(
        {
            "listen": "10.1.2.3:7000",
            "allow_plaintext": True,
            "member_id": "a",
            "policies": {"inline": [POLICY]},
        }
    )
    assert any("without tls" in w for w in cfg.warnings())


def test_share_without_membership_warns() -> None:
    cfg = parse_config({"member_id": "a", "policies": {"inline": [dict(POLICY, mode="share")]}})
    assert any("share-mode" in w for w in cfg.warnings())


def test_identity_order() -> None:
    assert resolve_identity(NodeConfig(member_id="x"), {}) == Identity("x", "config", True)
    ident = resolve_identity(NodeConfig(member_id_env="POD"), {"POD": "pod-1"})
    assert (ident.member_id, ident.source, ident.stable) == ("pod-1", "env", True)
    ident = resolve_identity(NodeConfig(member_id="x", member_id_env="POD"), {"POD": "pod-1"})
    assert ident == Identity("x", "config", True)  # config first


def test_default_identity_is_this_process_and_not_stable() -> None:
    ident = resolve_identity(NodeConfig(member_id_env="POD"), {})  # the variable is unset
    host = socket.gethostname()
    assert ident.source == ("hostname" if host else "nonce") and ident.stable is False
    prefix = f"{host or 'member'}-{os.getpid()}-"
    assert ident.member_id.startswith(prefix) and len(ident.member_id) > len(prefix)
    # The same id for every call in this process: warnings and the node must agree.
    assert resolve_identity(NodeConfig(), {}) == ident
    assert resolve_identity(NodeConfig(member_id_env="POD"), {"POD": ""}) == ident


@pytest.mark.slow
def test_processes_on_one_host_get_distinct_ids() -> None:
    code = "from mesh.config import NodeConfig; print(NodeConfig().identity({}).member_id)"
    ids = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
        for _ in range(2)
    } | {NodeConfig().identity({}).member_id}
    assert len(ids) == 3, ids


def test_an_unstable_identity_warns_and_says_how_to_pin_it() -> None:
    (w,) = [w for w in NodeConfig().warnings() if w.startswith("member_id:")]
    assert "not stable" in w and "member_id or member_id_env" in w
    assert NodeConfig().identity().member_id in w
    (w,) = [w for w in NodeConfig(member_id_env="RATEMESH_T_UNSET").warnings() if "member_id" in w]
    assert "$RATEMESH_T_UNSET (member_id_env) is unset" in w
    assert not [w for w in NodeConfig(member_id="a").warnings() if w.startswith("member_id")]


def test_policy_file_is_resolved_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "policies.yaml").write_text(json.dumps({"policies": [POLICY]}))
    (tmp_path / "node.yaml").write_text("member_id: a\npolicies: {file: policies.yaml}\n")
    cfg = load_config(tmp_path / "node.yaml")
    assert [p.tenant_id for p in cfg.policies] == ["acme"]
    assert cfg.policy_watch_ms == 1000  # the file is watched by default


def test_policy_watch_ms_needs_a_file_and_a_sane_period(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(json.dumps([POLICY]))
    base = {"file": str(tmp_path / "p.yaml")}
    assert parse_config({"policies": {**base, "watch_ms": 0}}).policy_watch_ms == 0
    for policies, problem in (
        ({"watch_ms": 100}, "only used with policies.file"),
        ({**base, "watch_ms": 5}, r"0 \(off\) or >= 10"),
        ({**base, "watch_ms": "1s"}, "integer"),
    ):
        with pytest.raises(ConfigError, match=problem) as err:
            parse_config({"policies": policies})
        assert err.value.field == "policies.watch_ms"


@pytest.mark.slow
def test_mesh_validate_cli(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "member_id: a\nlisten: 10.0.0.1:7000\nallow_plaintext: true\n"
        f"policies: {{inline: [{json.dumps(POLICY)}]}}\n"
    )
    out = mesh_validate(good)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["ok"] and res["identity"] == {"member_id": "a", "source": "config", "stable": True}
    assert any("without tls" in w for w in res["warnings"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("membership: {source: static}\n")
    out = mesh_validate(bad)
    assert out.returncode == 2
    assert json.loads(out.stdout)["field"] == "membership.members"


def test_a_node_resends_reports_late_unless_told_otherwise(tmp_path: Path) -> None:
    from mesh.config import NODE_RETRY_MAX_MS, load_config

    base = {
        "member_id": "a",
        "listen": "127.0.0.1:0",
        "policies": {
            "inline": [
                {
                    "tenant_id": "t",
                    "metric": "read_iops",
                    "generation": 1,
                    "target_rate": 10,
                    "global_burst": 10,
                    "local_burst_cap": 1,
                }
            ]
        },
    }
    for core, want in (
        ({}, NODE_RETRY_MAX_MS),
        ({"report_retry_max_ms": 40}, 40),
        ({"report_retry_ms": 2000}, 2000),
    ):
        path = tmp_path / "n.yaml"
        path.write_text(yaml.safe_dump(dict(base, core=core)))
        assert load_config(path).core.report_retry_max_ms == want


# -- ports, the shared vocabulary and the shared loader ----------------------------


@pytest.mark.parametrize(
    "data, field",
    [
        ({"listen": "127.0.0.1:99999"}, "listen"),
        ({"listen": "127.0.0.1:65536"}, "listen"),
        ({"listen": "::1:7001"}, "listen"),  # an IPv6 host goes in brackets
        ({"advertise": "127.0.0.1:0"}, "advertise"),  # others dial it: 0 is no port
        ({"advertise": "127.0.0.1:70000"}, "advertise"),
        ({"telemetry_listen": "127.0.0.1:65536"}, "telemetry_listen"),
        (
            {"membership": {"source": "static", "members": {"a": "127.0.0.1:0"}}},
            "membership.members.a",
        ),
        (
            {"membership": {"source": "static", "members": {"a": "127.0.0.1:99999"}}},
            "membership.members.a",
        ),
        ({"policies": {"coordinator": {"addr": "127.0.0.1:99999"}}}, "policies.coordinator.addr"),
        ({"policies": {"coordinator": {"addr": "127.0.0.1:0"}}}, "policies.coordinator.addr"),
    ],
)
def test_ports_are_1_to_65535(data: dict[str, Any], field: str) -> None:
    import ratemesh.errors

    before = json.dumps(data, sort_keys=True)
    with pytest.raises(ratemesh.errors.ConfigError) as err:
        parse_config(data)
    assert isinstance(err.value, ConfigError)  # still the mesh's own class too
    assert err.value.field == field and "\n" not in str(err.value), str(err.value)
    assert json.dumps(data, sort_keys=True) == before  # nothing changed


def test_port_0_means_any_free_port_where_the_node_reports_it() -> None:
    # Mesh.address and Mesh.telemetry_address carry the bound ports (tests/mesh/node use them)
    cfg = parse_config({"listen": "127.0.0.1:0", "telemetry_listen": "[::1]:0"})
    assert cfg.listen == "127.0.0.1:0" and cfg.telemetry_listen == "[::1]:0"
    assert parse_config({"listen": "[::1]:65535", "advertise": "[::1]:1"}).advertise == "[::1]:1"


def test_unknown_keys_list_the_allowed_ones() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"tls": {"cert": "c", "key": "k", "kye": "k"}})
    assert err.value.field == "tls.kye" and "unknown key (a typo?)" in err.value.problem
    assert "expected one of: ca, cert, key" in err.value.problem


@pytest.mark.parametrize(
    "content, words",
    [
        (b"listen: caf\xe9:1\n", ("not UTF-8", "offset 11")),
        (b"[" * 5000 + b"]" * 5000, ("deeper than 64 levels",)),
        (b"listen: [127.0.0.1:1\n", ("not valid YAML", "line 2")),
    ],
)
def test_a_bad_file_is_one_error_naming_it(
    tmp_path: Path, content: bytes, words: tuple[str, ...]
) -> None:
    import ratemesh.errors

    path = tmp_path / "node.yaml"
    path.write_bytes(content)
    with pytest.raises(ratemesh.errors.ConfigError) as err:
        load_config(path)
    assert isinstance(err.value, ConfigError) and err.value.field == "config"
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert all(w in err.value.problem for w in words), str(err.value)
    assert path.read_bytes() == content
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "missing.yaml")
    assert "no such file" in err.value.problem


def test_a_bad_policy_file_names_the_setting_and_the_file(tmp_path: Path) -> None:
    policies = tmp_path / "p.yaml"
    policies.write_bytes(b"- {tenant_id: caf\xe9}\n")
    node = tmp_path / "node.yaml"
    node.write_text(yaml.safe_dump({"member_id": "a", "policies": {"file": "p.yaml"}}))
    with pytest.raises(ConfigError) as err:
        load_config(node)
    assert err.value.field == "policies.file" and str(policies) in err.value.problem
    assert "not UTF-8" in err.value.problem


@pytest.mark.slow  # starts a process
def test_listen_99999_is_refused_by_mesh_validate(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("member_id: a\nlisten: 127.0.0.1:99999\n")
    out = mesh_validate(path)
    assert out.returncode == 2, out.stderr
    assert json.loads(out.stdout)["field"] == "listen"


@pytest.mark.slow
def test_mesh_validate_says_a_default_identity_is_not_stable(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        "membership: {source: etcd, endpoints: [http://127.0.0.1:2379]}\n"
        f"policies: {{inline: [{json.dumps(POLICY)}]}}\n"
    )
    out = mesh_validate(path)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["identity"]["stable"] is False and res["identity"]["source"] != "config"
    (w,) = [w for w in res["warnings"] if w.startswith("member_id:")]
    assert "member_id or member_id_env" in w
    assert f"warning: {w}" in out.stderr.splitlines()


def test_the_coordinator_key_comes_from_a_file_or_a_variable_never_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "worker.key").write_text("key-from-file\n")
    coord = {"addr": "127.0.0.1:7443", "api_key_file": "worker.key"}
    cfg = parse_config({"policies": {"coordinator": coord}}, base=tmp_path)
    assert cfg.coordinator is not None and cfg.coordinator.api_key == "key-from-file"
    assert "key-from-file" not in repr(cfg)
    monkeypatch.setenv("WORKER_KEY", "key-from-env")
    coord = {"addr": "127.0.0.1:7443", "api_key_env": "WORKER_KEY"}
    cfg = parse_config({"policies": {"coordinator": coord}})
    assert cfg.coordinator is not None and cfg.coordinator.api_key == "key-from-env"
    for extra, field in [
        ({"api_key_env": "UNSET_VAR_X"}, "policies.coordinator.api_key_env"),
        ({"api_key_file": "none.key"}, "policies.coordinator.api_key_file"),
        (
            {"api_key_env": "WORKER_KEY", "api_key_file": "worker.key"},
            "policies.coordinator.api_key_file",
        ),
        ({"ca": "none.pem"}, "policies.coordinator.ca"),
        ({"api_key": "clear"}, "policies.coordinator.api_key"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_config(
                {"policies": {"coordinator": {"addr": "127.0.0.1:7443", **extra}}}, base=tmp_path
            )
        assert info.value.field == field, str(info.value)


def test_a_node_config_takes_the_open_vocabulary_and_names_a_bad_rate() -> None:
    """Open metric names with a unit, rates as text and descriptors in a node's
    inline policies; a mistake is one ConfigError naming the entry, field and text."""
    entry = {
        "tenant_id": "acme",
        "metric": "tokens",
        "unit": "tokens",
        "generation": 1,
        "target_rate": "60k/minute",
        "global_burst": "8k",
        "local_burst_cap": "1k",
        "descriptor": {"route": "/v1/chat"},
    }
    cfg = parse_config({"member_id": "a", "policies": {"inline": [entry]}})
    (p,) = cfg.policies
    assert (p.metric, p.unit.value, p.target_rate, p.descriptor) == (
        "tokens",
        "tokens",
        1000,
        ("route", "/v1/chat"),
    )
    with pytest.raises(ConfigError) as err:
        parse_config({"policies": {"inline": [{**entry, "target_rate": "100/fortnight"}]}})
    assert err.value.field.endswith("[0].target_rate")
    assert err.value.problem == (
        '"100/fortnight": unknown period "fortnight"; use second, minute, hour, day, month or year'
    )

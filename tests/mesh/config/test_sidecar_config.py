"""The node config's sidecar section: off by default, bounds named, and an address beyond
loopback refused without the peer port's credentials (one line naming the field)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mesh.config import SidecarConfig, parse_config
from mesh.errors import ConfigError
from tests.mesh._util import mesh_validate


def _secret(tmp_path: Path) -> str:
    p = tmp_path / "fleet.secret"
    p.write_text("0123456789abcdef0123456789abcdef\n")
    p.chmod(0o600)
    return str(p)


def test_off_by_default_and_old_telemetry_configs_stay_valid() -> None:
    cfg = parse_config({"telemetry_listen": "0.0.0.0:9101"})
    assert cfg.sidecar == SidecarConfig()
    assert cfg.sidecar.listens() == []
    assert cfg.telemetry_listen == "0.0.0.0:9101"  # /metrics and /health only: no auth asked


def test_loopback_needs_no_credentials() -> None:
    cfg = parse_config(
        {"sidecar": {"grpc_listen": "127.0.0.1:7002", "http_listen": "[::1]:0", "items_max": 50}}
    )
    assert cfg.sidecar.grpc_listen == "127.0.0.1:7002" and cfg.sidecar.items_max == 50


@pytest.mark.parametrize(
    ("sidecar", "field", "says"),
    [
        ({"grpc_listen": "0.0.0.0:7002"}, "sidecar.grpc_listen", "not a loopback address"),
        ({"http_listen": "10.0.0.5:80"}, "sidecar.http_listen", "set sidecar.token_file"),
        ({"grpc_listen": "[::1]:1", "require_auth": True}, "sidecar.grpc_listen", "require_auth"),
        ({"grpc_listen": "nope"}, "sidecar.grpc_listen", ""),
        ({"grpc_listen": "127.0.0.1:1", "items_max": 0}, "sidecar.items_max", ""),
        ({"max_message_bytes": 10}, "sidecar.max_message_bytes", ""),
        ({"concurrent_max": "many"}, "sidecar.concurrent_max", ""),
        ({"grpc_port": 1}, "sidecar.grpc_port", ""),
        ("on", "sidecar", "must be a mapping"),
    ],
)  # fmt: skip
def test_mistakes_name_the_field(sidecar: Any, field: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({"sidecar": sidecar})
    assert e.value.field == field and says in str(e.value)
    assert "\n" not in str(e.value)


def test_beyond_loopback_with_the_fleet_secret_needs_tls_or_allow_plaintext(
    tmp_path: Path,
) -> None:
    data = {"fleet_secret_file": _secret(tmp_path), "sidecar": {"grpc_listen": "0.0.0.0:7002"}}
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert e.value.field == "sidecar.grpc_listen" and "allow_plaintext" in str(e.value)
    cfg = parse_config({**data, "allow_plaintext": True})
    assert cfg.sidecar.needs_auth("0.0.0.0:7002")


@pytest.mark.slow  # starts a process
def test_mesh_validate_refuses_an_exposed_sidecar_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"sidecar": {"http_listen": "0.0.0.0:9101"}}))
    r = mesh_validate(path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "sidecar.http_listen" in r.stderr


@pytest.mark.slow  # starts a process
def test_mesh_validate_names_the_sidecar_addresses(tmp_path: Path) -> None:
    import json

    path = tmp_path / "node.yaml"
    cfg = {
        "member_id": "a",
        "fleet_secret_file": _secret(tmp_path),
        "allow_plaintext": True,
        "sidecar": {"grpc_listen": "127.0.0.1:7002", "http_listen": "0.0.0.0:7003"},
    }
    path.write_text(yaml.safe_dump(cfg))
    r = mesh_validate(path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sidecar"] == {
        "grpc_listen": {
            "address": "127.0.0.1:7002",
            "bearer_token": False,
            "token": "fleet_secret",
        },
        "http_listen": {"address": "0.0.0.0:7003", "bearer_token": True, "token": "fleet_secret"},
    }

"""Guessable credentials are refused where they are configured: governord's tenant and
coordinator API keys, a node's fleet secret and its sidecar token. Each refusal is one line
that names the key and exits 2; a random value of the same shape is accepted in the same test.

The attack: an operator pastes the example's value (deploy/k8s/secrets.example.yaml) or a
one-character key, and whoever guesses it is a tenant, a member or a worker."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest
import yaml

from ratemesh.secretcheck import SECRET_MIN_BYTES
from tests.deploy._files import K8S, cli, validate
from tests.governor._daemon import free_port

pytestmark = pytest.mark.slow

TIMEOUT_S = 120


def _example_values() -> list[str]:
    """The placeholder values the example Secrets ship (their first lines)."""
    out = []
    for doc in yaml.safe_load_all((K8S / "secrets.example.yaml").read_text()):
        if doc and doc.get("type") == "Opaque":
            out += [str(v).splitlines()[0] for v in doc["stringData"].values()]
    return out


EXAMPLES = _example_values()
# One of each kind of weak value; the example Secrets' values are added below.
WEAK = [
    "k",
    "changeme",
    "a" * 32,
    "secretsecretsecretsecret",
    "0123456789abcdef",
    "replace-me-with-a-long-random-value",
    "example-fleet-key-for-prod-2026",
    *EXAMPLES,
]


def _strong() -> str:
    return secrets.token_hex(16)


def _assert_refused(got: subprocess.CompletedProcess[str], field: str, value: str) -> None:
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 2, (got.returncode, got.stderr)
    assert len(lines) == 1 and field in lines[0], lines
    assert "Traceback" not in got.stderr
    if len(value) >= 4:
        assert value not in got.stderr and value not in got.stdout  # never echoed


def _governord_config(tmp_path: Path, port: int = 7443) -> Path:
    cfg = tmp_path / "governord.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{port}",
                "store": "memory:",
                "tenants": {"acme": {"api_key_env": "GOVERNOR_KEY_ACME"}},
                "coordinator": {
                    "keys": {"deploy": {"api_key_env": "GOVERNOR_KEY_DEPLOY", "scope": "worker"}}
                },
            }
        )
    )
    return cfg


def test_example_secrets_are_placeholders_the_checks_know() -> None:
    assert len(EXAMPLES) >= 4 and all(v.startswith("CHANGE-ME") for v in EXAMPLES)


@pytest.mark.parametrize("weak", WEAK)
def test_governord_refuses_a_guessable_api_key(tmp_path: Path, weak: str) -> None:
    cfg = _governord_config(tmp_path)
    ok = validate(
        "governord", cfg, {"GOVERNOR_KEY_ACME": _strong(), "GOVERNOR_KEY_DEPLOY": _strong()}
    )
    assert ok.returncode == 0, ok.stderr  # the baseline: random keys of the same config
    tenant = validate(
        "governord", cfg, {"GOVERNOR_KEY_ACME": weak, "GOVERNOR_KEY_DEPLOY": _strong()}
    )
    _assert_refused(tenant, "tenants.acme.api_key_env", weak)
    coord = validate(
        "governord", cfg, {"GOVERNOR_KEY_ACME": _strong(), "GOVERNOR_KEY_DEPLOY": weak}
    )
    _assert_refused(coord, "coordinator.keys.deploy.api_key_env", weak)


def test_governord_will_not_start_on_a_one_character_key(tmp_path: Path) -> None:
    cfg = _governord_config(tmp_path, free_port())  # were it to start, it binds a free port
    env = {**os.environ, "GOVERNOR_KEY_ACME": "k", "GOVERNOR_KEY_DEPLOY": _strong()}
    got = subprocess.run(
        [cli("governord"), "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=tmp_path,
    )
    _assert_refused(got, "tenants.acme.api_key_env", "k")
    assert "LISTENING" not in got.stdout


def _node_config(tmp_path: Path, secret: str, token: str) -> Path:
    (tmp_path / "fleet.secret").write_text(secret + "\n")
    (tmp_path / "sidecar.token").write_text(token + "\n")
    os.chmod(tmp_path / "fleet.secret", 0o600)
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "member_id": "node-1",
                "listen": "127.0.0.1:7001",
                "fleet_secret_file": "fleet.secret",
                "sidecar": {"grpc_listen": "127.0.0.1:7002", "token_file": "sidecar.token"},
            }
        )
    )
    return cfg


@pytest.mark.parametrize("weak", WEAK)
def test_a_node_refuses_a_guessable_fleet_secret_or_sidecar_token(
    tmp_path: Path, weak: str
) -> None:
    ok = validate("mesh", _node_config(tmp_path, _strong(), _strong()), {})
    assert ok.returncode == 0, ok.stderr
    secret = validate("mesh", _node_config(tmp_path, weak, _strong()), {})
    _assert_refused(secret, "fleet_secret_file", weak)
    token = validate("mesh", _node_config(tmp_path, _strong(), weak), {})
    _assert_refused(token, "sidecar.token_file", weak)


def test_the_minimum_is_128_bits() -> None:
    assert SECRET_MIN_BYTES == 16

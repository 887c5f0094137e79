"""`mesh validate` and `governord validate` say, one line each on stderr, what a config
exposes: a sidecar whose token is the fleet secret (its callers could speak to peers as a
member), a sidecar whose callers must hold the fleet secret, and listeners on every interface
(0.0.0.0, ::) that ask no credential or carry one in clear. Warnings exit 0; `--strict`
makes them exit 1. The same config with the exposure removed says nothing."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy._files import cli

pytestmark = pytest.mark.slow

TIMEOUT_S = 120


def _run(tool: str, config: Path, *flags: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [cli(tool), "validate", "--config", str(config), *flags],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **(env or {})},
        cwd=config.parent,
    )


def _warnings(stderr: str) -> list[str]:
    lines = stderr.strip().splitlines()
    assert all(line.startswith("warning: ") for line in lines), lines
    return [line.removeprefix("warning: ") for line in lines]


def _node(tmp_path: Path, **over: Any) -> Path:
    fleet = secrets.token_hex(16)
    (tmp_path / "fleet.secret").write_text(fleet + "\n")
    os.chmod(tmp_path / "fleet.secret", 0o600)
    token = over.pop("token", secrets.token_hex(16))
    (tmp_path / "sidecar.token").write_text((fleet if token == "FLEET" else token) + "\n")
    cfg: dict[str, Any] = {
        "member_id": "node-1",
        "listen": "127.0.0.1:7001",
        "telemetry_listen": "127.0.0.1:9101",
        "fleet_secret_file": "fleet.secret",
        "sidecar": {"grpc_listen": "127.0.0.1:7002", "token_file": "sidecar.token"},
        "policies": {"inline": []},
        **over,
    }
    if cfg["sidecar"] is None:
        del cfg["sidecar"]
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _say(tmp_path: Path, **over: Any) -> tuple[list[str], Any]:
    path = _node(tmp_path, **over)
    got = _run("mesh", path, "--json")  # --json: the table stays off stderr
    assert got.returncode == 0, got.stderr
    strict = _run("mesh", path, "--json", "--strict")
    said = [w for w in _warnings(got.stderr) if not w.startswith("policies")]
    return said, strict


def test_a_quiet_node_config_says_nothing(tmp_path: Path) -> None:
    said, strict = _say(tmp_path, policies={"inline": [_limit()]})
    assert said == [] and strict.returncode == 0, (said, strict.stderr)


def _limit() -> dict[str, Any]:
    return {
        "tenant_id": "*",
        "metric": "read_iops",
        "generation": 1,
        "target_rate": 10,
        "global_burst": 5,
        "local_burst_cap": 5,
    }


def test_a_sidecar_token_equal_to_the_fleet_secret_is_warned(tmp_path: Path) -> None:
    said, strict = _say(tmp_path, token="FLEET")
    assert len(said) == 1 and said[0].startswith("sidecar.token_file: "), said
    assert "fleet secret" in said[0]
    assert strict.returncode == 1


def test_an_exposed_sidecar_without_its_own_token_is_warned(tmp_path: Path) -> None:
    side = {"grpc_listen": "0.0.0.0:7002", "http_listen": "[::]:7003"}
    said, strict = _say(tmp_path, sidecar=side, allow_plaintext=True)
    assert [w.split(":")[0] for w in said] == ["sidecar.grpc_listen", "sidecar.http_listen"], said
    assert all("fleet secret" in w for w in said)
    assert strict.returncode == 1


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "[::]"])
def test_listeners_on_every_interface_without_a_credential_are_warned(
    tmp_path: Path, wildcard: str
) -> None:
    said, strict = _say(tmp_path, telemetry_listen=f"{wildcard}:9101")
    assert [w.split(":")[0] for w in said] == ["telemetry_listen"], said
    assert "every interface" in said[0] and strict.returncode == 1
    # with the operator's token, tenant detail off the host asks for it: nothing to say
    (tmp_path / "operator.token").write_text(secrets.token_hex(16) + "\n")
    side = {
        "grpc_listen": "127.0.0.1:7002",
        "token_file": "sidecar.token",
        "operator_token_file": "operator.token",
    }
    said, strict = _say(
        tmp_path, telemetry_listen=f"{wildcard}:9101", sidecar=side, policies={"inline": [_limit()]}
    )
    assert said == [] and strict.returncode == 0, said
    bare = tmp_path / "bare"
    bare.mkdir()
    said, _ = _say(bare, listen=f"{wildcard}:7001", fleet_secret_file=None, allow_plaintext=True)
    assert [w for w in said if w.startswith("listen: ") and "every interface" in w], said


def _governord(tmp_path: Path, **over: Any) -> Path:
    cfg: dict[str, Any] = {
        "listen": "127.0.0.1:7443",
        "store": "memory:",
        "tenants": {"acme": {"api_key_env": "GOVERNOR_KEY_ACME"}},
        **over,
    }
    path = tmp_path / "governord.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _gov_say(tmp_path: Path, **over: Any) -> tuple[list[str], Any]:
    env = {"GOVERNOR_KEY_ACME": secrets.token_hex(16), "GOVERNOR_PAGES": secrets.token_hex(16)}
    path = _governord(tmp_path, **over)
    got = _run("governord", path, env=env)
    assert got.returncode == 0, got.stderr
    assert "is valid" in got.stdout
    return _warnings(got.stderr), _run("governord", path, "--strict", env=env)


def test_governord_says_nothing_on_loopback(tmp_path: Path) -> None:
    said, strict = _gov_say(tmp_path, metrics="127.0.0.1:9102")
    assert said == [] and strict.returncode == 0, said


def test_governord_warns_on_every_interface_in_plaintext_and_open_metrics(tmp_path: Path) -> None:
    said, strict = _gov_say(
        tmp_path, listen="0.0.0.0:7443", allow_plaintext=True, metrics="[::]:9102"
    )
    assert [w.split(":")[0] for w in said] == ["listen[0]", "metrics"], said
    assert "in clear" in said[0] and "no pages token" in said[1]
    assert strict.returncode == 1
    said, _ = _gov_say(tmp_path, metrics="[::]:9102", pages={"token_env": "GOVERNOR_PAGES"})
    assert said == [], said


def test_governord_says_its_warnings_when_it_starts(tmp_path: Path) -> None:
    env = {"GOVERNOR_KEY_ACME": secrets.token_hex(16)}
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        port = s.getsockname()[1]
    path = _governord(tmp_path, listen=f"0.0.0.0:{port}", allow_plaintext=True)
    proc = subprocess.Popen(
        [cli("governord"), "--config", str(path)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        cwd=tmp_path,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # said before anything else
        want = f"governord: warning: listen[0]: 0.0.0.0:{port} is every interface"
        assert first.startswith(want), first
    finally:
        proc.kill()
        proc.wait(TIMEOUT_S)
        if proc.stderr is not None:
            proc.stderr.close()

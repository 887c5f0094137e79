"""The fleet secret in a node config: from a file or an environment variable, never the
config text; each mistake is one ConfigError naming the field, and a node with neither a
secret nor client certificates is legal but warned about (`mesh validate` exits 0)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from bench._procs import free_port, read_ready, spawn, stop
from mesh.config import FLEET_SECRET_MIN_BYTES, parse_config
from mesh.errors import ConfigError
from tests.mesh._util import mesh_validate, run_mesh

SECRET = b"0123456789abcdef-fleet-secret"
NO_PROOF = "fleet_secret_file: no fleet secret and no client certificates"


def _cfg(**extra: Any) -> dict[str, Any]:
    return {"member_id": "a", "policies": {"inline": []}, **extra}


def _write(tmp_path: Path, data: bytes, mode: int = 0o600) -> str:
    path = tmp_path / "secret"
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


def test_the_secret_comes_from_a_file_or_a_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = parse_config(_cfg(fleet_secret_file=_write(tmp_path, SECRET + b"\n")))
    assert cfg.fleet_secret == SECRET  # the file's trailing newline is not part of it
    assert cfg.fleet_secrets_accepted == (SECRET,)
    new = b"next-fleet-key-7c2e"
    two = parse_config(_cfg(fleet_secret_file=_write(tmp_path, new + b"\n\n" + SECRET)))
    assert two.fleet_secret == new and two.fleet_secrets_accepted == (new, SECRET)
    assert SECRET.decode() not in repr(cfg)
    assert not [w for w in cfg.warnings() if w.startswith("fleet_secret")]
    monkeypatch.setenv("RATEMESH_T_SECRET", SECRET.decode())
    cfg = parse_config(_cfg(fleet_secret_env="RATEMESH_T_SECRET"))
    assert cfg.fleet_secret == SECRET
    assert cfg.fleet_secret_from == "fleet_secret_env: RATEMESH_T_SECRET"


@pytest.mark.parametrize(
    "extra, field, says",
    [
        ({"fleet_secret_file": "/nonexistent/secret"}, "fleet_secret_file", "does not exist"),
        ({"fleet_secret_file": "EMPTY"}, "fleet_secret_file", "is empty"),
        ({"fleet_secret_file": "SHORT"}, "fleet_secret_file", f"at least {FLEET_SECRET_MIN_BYTES}"),
        ({"fleet_secret_env": "RATEMESH_T_SECRET_UNSET"}, "fleet_secret_env", "is not set"),
        ({"fleet_secret_env": "RATEMESH_T_SHORT"}, "fleet_secret_env", "holds 5 bytes"),
        ({"fleet_secret_env": 7}, "fleet_secret_env", ""),
        ({"fleet_secret_file": "SHORT2"}, "fleet_secret_file", "(line 2) holds 5 bytes"),
        ({"fleet_secret_file": "FOUR"}, "fleet_secret_file", "holds 4 secrets; at most 3"),
        (
            {"fleet_secret_file": "SHORT", "fleet_secret_env": "RATEMESH_T_SHORT"},
            "fleet_secret_env",
            "not both",
        ),
    ],
)
def test_secret_mistakes_name_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], field: str, says: str
) -> None:
    monkeypatch.delenv("RATEMESH_T_SECRET_UNSET", raising=False)
    monkeypatch.setenv("RATEMESH_T_SHORT", "short")
    (tmp_path / "EMPTY").write_bytes(b"\n")
    (tmp_path / "SHORT").write_bytes(b"short")
    (tmp_path / "SHORT2").write_bytes(SECRET + b"\nshort\n")
    (tmp_path / "FOUR").write_bytes(b"\n".join([SECRET] * 4))
    with pytest.raises(ConfigError) as err:
        parse_config(_cfg(**extra), base=tmp_path)
    assert err.value.field == field
    assert says in str(err.value) and "\n" not in str(err.value)


def test_neither_tls_nor_a_secret_warns(tmp_path: Path) -> None:
    assert any(w.startswith(NO_PROOF) for w in parse_config(_cfg()).warnings())
    loose = parse_config(_cfg(fleet_secret_file=_write(tmp_path, SECRET, 0o644)))
    assert any("readable by group or others" in w for w in loose.warnings())


@pytest.mark.slow
def test_mesh_validate_warns_without_a_secret_and_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(json.dumps(_cfg()))
    out = mesh_validate(path)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if "fleet_secret" in ln]
    assert line.startswith(f"warning: {NO_PROOF}")
    summary = json.loads(out.stdout)
    assert any(w.startswith(NO_PROOF) for w in summary["warnings"])
    assert summary["peer_identity"] == []
    path.write_text(json.dumps(_cfg(fleet_secret_file=_write(tmp_path, SECRET))))
    out = mesh_validate(path)
    assert out.returncode == 0 and "fleet_secret" not in out.stderr, out.stderr
    assert json.loads(out.stdout)["peer_identity"] == ["fleet_secret"]
    path.write_text(json.dumps(_cfg(fleet_secret_file="missing")))
    out = mesh_validate(path)
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert "fleet_secret_file" in line and "does not exist" in line


@pytest.mark.slow
def test_mesh_node_logs_the_warning_and_reads_the_secret_from_its_environment(
    tmp_path: Path,
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(json.dumps(_cfg(listen=f"127.0.0.1:{free_port()}")))
    plain = spawn(["-m", "mesh.cli", "node", "--config", str(path)])
    try:
        assert read_ready(plain)["member_id"] == "a"
        plain.send_signal(signal.SIGTERM)
        plain.wait(10)
        assert plain.stderr is not None
        said = [json.loads(ln) for ln in plain.stderr.read().splitlines()]
        assert any(e["event"] == "config_warning" and NO_PROOF in e["msg"] for e in said)
    finally:
        stop(plain)
    path.write_text(
        json.dumps(_cfg(listen=f"127.0.0.1:{free_port()}", fleet_secret_env="RATEMESH_T_FS"))
    )
    keyed = spawn(
        ["-m", "mesh.cli", "node", "--config", str(path)],
        env={"RATEMESH_T_FS": "fleet-secret-of-the-test-4b8e"},
    )
    try:
        assert read_ready(keyed)["member_id"] == "a"
    finally:
        stop(keyed)
    unset = run_mesh(
        "node",
        "--config",
        str(path),
        env={k: v for k, v in os.environ.items() if k != "RATEMESH_T_FS"},
    )
    assert unset.returncode == 2, unset.stderr
    (line,) = unset.stderr.splitlines()
    assert "fleet_secret_env" in line and "$RATEMESH_T_FS is not set" in line

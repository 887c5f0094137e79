"""Consent (seed 002): nothing dials unless the config names shared_state.redis with the
literal `external: allow`; a mistake names its field; validate warns what is given up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mesh.cli import main
from mesh.config import parse_config
from mesh.errors import ConfigError
from mesh.node._build import build_redis

REDIS_POLICY = {
    "tenant_id": "acme",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 100,
    "global_burst": 10,
    "local_burst_cap": 5,
    "mode": "redis",
}


def _cfg(redis: Any = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"member_id": "a", "policies": {"inline": [REDIS_POLICY]}, **extra}
    if redis is not None:
        out["shared_state"] = {"redis": redis}
    return out


@pytest.mark.parametrize(
    "redis,field",
    [
        ({"addr": "10.0.0.10:6379"}, "shared_state.redis.external"),
        ({"addr": "10.0.0.10:6379", "external": "yes"}, "shared_state.redis.external"),
        ({"addr": "10.0.0.10:6379", "external": True}, "shared_state.redis.external"),
        ({"external": "allow"}, "shared_state.redis.addr"),
        ({"external": "allow", "addr": "10.0.0.10"}, "shared_state.redis.addr"),
        ({"external": "allow", "addr": "h:1", "tls": "yes"}, "shared_state.redis.tls"),
        ({"external": "allow", "addr": "h:1", "db": 1}, "shared_state.redis.db"),
        ({"external": "allow", "addr": "h:1", "password_env": "RM_UNSET_X"}, None),
        ("10.0.0.10:6379", "shared_state.redis"),
    ],
)
def test_mistakes_name_the_field(redis: Any, field: str | None) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(_cfg(redis))
    assert exc.value.field == (field or "shared_state.redis.password_env")


def test_consent_and_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RM_REDIS_PW", "s3cret")
    cfg = parse_config(
        _cfg({"external": "allow", "addr": "[::1]:6380", "password_env": "RM_REDIS_PW"})
    )
    r = cfg.shared_state.redis
    assert r is not None and (r.host, r.port, r.password, r.tls) == ("::1", 6380, "s3cret", False)
    assert "s3cret" not in repr(cfg)


def test_no_section_builds_no_client() -> None:
    cfg = parse_config(_cfg())
    assert cfg.shared_state.redis is None and build_redis(cfg) is None
    assert any("redis-mode policy with no shared_state.redis" in w for w in cfg.warnings())


def test_validate_warns_naming_the_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        yaml.safe_dump(_cfg({"external": "allow", "addr": "10.0.0.10:6379", "tls": True}))
    )
    assert main(["validate", "--config", str(path), "--json"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("warning: shared_state.redis:"))
    assert '"10.0.0.10:6379"' in line and "fleet <= N x limit" in line


def test_validate_refuses_an_address_without_consent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(_cfg({"addr": "10.0.0.10:6379"})))
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shared_state.redis.external" in err[0]

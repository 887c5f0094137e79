"""A replica's name (its member id) is a DNS label, a DNS name or an address (seed 002)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesh.cli import main
from mesh.config import parse_config, resolve_identity
from mesh.errors import ConfigError


@pytest.mark.parametrize(
    "name", ["web-0", "a", "web-0.mesh.svc", "10.0.0.5", "10.0.0.5:7001", "[::1]:7001", "::1"]
)
def test_accepted(name: str) -> None:
    assert parse_config({"member_id": name}).member_id == name


@pytest.mark.parametrize(
    "name", ["Not A DNS_Label!!", "Web-0", "web_0", "-web", "web-", "a" * 64, "a..b"]
)
def test_refused_in_one_line_naming_the_field(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"member_id": name})
    text = str(info.value)
    assert text.startswith("member_id:") and "\n" not in text and "DNS label" in text


def test_env_name_is_checked_too() -> None:
    cfg = parse_config({"member_id_env": "POD_NAME"})
    with pytest.raises(ConfigError, match=r"^member_id_env \(\$POD_NAME\): 'Not A DNS_Label!!'"):
        resolve_identity(cfg, {"POD_NAME": "Not A DNS_Label!!"})
    assert resolve_identity(cfg, {"POD_NAME": "web-1"}).member_id == "web-1"


def test_the_node_commands_override_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text('listen: "127.0.0.1:0"\n')
    assert main(["node", "--config", str(config), "--member-id", "Not A DNS_Label!!"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mesh node: --member-id: 'Not A DNS_Label!!' is not a replica name")
    assert err.count("\n") == 1

"""deploy/systemd: both units pass `systemd-analyze verify` with nothing to say, and the configs
they start pass the real validators.

The units start /opt/ratemesh/.venv/bin/{mesh,governord}, where docs/deploy.md installs
them; verify refuses a unit whose binary does not exist, so the copy verified here points
ExecStart at this test's venv instead (the one rewrite; the rest of the unit is as shipped).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy._files import DEPLOY, stand_in, validate

UNITS = DEPLOY / "systemd"
INSTALLED = "/opt/ratemesh/.venv/bin/"


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is required under CI=true (Debian: systemd)")
        pytest.skip("systemd-analyze is not installed")
    return found


def test_every_unit_is_here_and_starts_the_installed_console_script() -> None:
    units = sorted(p.name for p in UNITS.glob("*.service"))
    assert units == ["governord.service", "mesh-node.service"]
    for unit in units:
        text = (UNITS / unit).read_text()
        (start,) = re.findall(r"^ExecStart=(\S+)", text, re.M)
        assert start == INSTALLED + ("governord" if unit.startswith("gov") else "mesh")


@pytest.mark.slow
@pytest.mark.parametrize("unit", ["governord.service", "mesh-node.service"])
def test_the_unit_passes_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    tool = _systemd_analyze()
    venv_bin = str(Path(sys.executable).parent) + "/"
    text = (UNITS / unit).read_text()
    assert INSTALLED in text
    (tmp_path / unit).write_text(text.replace(INSTALLED, venv_bin))
    done = subprocess.run(
        [tool, "verify", str(tmp_path / unit)], capture_output=True, text=True, timeout=120
    )
    # verify exits 0 on an unknown key or a bad value, but says so: nothing said is the bar
    said = [line for line in (done.stdout + done.stderr).splitlines() if unit in line]
    assert done.returncode == 0 and said == [], done.stdout + done.stderr


@pytest.mark.parametrize("unit", ["governord.service", "mesh-node.service"])
def test_the_unit_is_hardened(unit: str) -> None:
    text = (UNITS / unit).read_text()
    for line in (
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
    ):
        assert re.search(rf"^{re.escape(line)}$", text, re.M), line


def test_governord_keeps_its_sqlite_record_in_its_state_directory() -> None:
    text = (UNITS / "governord.service").read_text()
    state = re.findall(r"^StateDirectory=(\S+)", text, re.M)
    cfg = (DEPLOY / "governord.yaml").read_text()
    (store,) = re.findall(r"^store: sqlite:(\S+)", cfg, re.M)
    assert state and store.startswith(f"/var/lib/{state[0]}/")


@pytest.mark.slow
@pytest.mark.parametrize(
    "unit,tool,env",
    [
        ("governord.service", "governord", ["GOVERNOR_KEY_ACME", "GOVERNOR_WORKER_KEY"]),
        ("mesh-node.service", "mesh", ["POD_NAME"]),
    ],
)
def test_the_config_a_unit_starts_passes_its_validator(
    unit: str, tool: str, env: list[str], tmp_path: Path
) -> None:
    """/etc/ratemesh/NAME.yaml in a unit is deploy/NAME.yaml, installed beside deploy's
    policies.yaml."""
    text = (UNITS / unit).read_text()
    (config,) = re.findall(r"--config /etc/ratemesh/(\S+)", text)
    for name in (config, "policies.yaml"):
        shutil.copy(DEPLOY / name, tmp_path / name)
    done = validate(tool, tmp_path / config, {k: stand_in(k.lower()) for k in env})
    assert done.returncode == 0, done.stderr
    if tool == "mesh":
        result = json.loads(done.stdout)
        assert result["ok"] and result["identity"]["source"] == "env"


@pytest.mark.slow
def test_the_dns_example_validates_with_the_name_its_header_describes(tmp_path: Path) -> None:
    """deploy/mesh-node-dns.yaml (SRV members named by target) beside deploy's policies."""
    for name in ("mesh-node-dns.yaml", "policies.yaml"):
        shutil.copy(DEPLOY / name, tmp_path / name)
    fqdn = "ratemesh-0.ratemesh.prod.svc.cluster.local"
    done = validate("mesh", tmp_path / "mesh-node-dns.yaml", {"POD_FQDN": fqdn})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] and result["identity"]["member_id"] == fqdn
    assert result["membership"] == "dns"

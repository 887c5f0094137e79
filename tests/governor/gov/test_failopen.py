"""Seed 003's fail-open at the import level: a `slot()` that cannot load the governor, or
reach governord or a state directory, runs the work and says so in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench._procs import free_port

WORK = """
import sys
{setup}
from governor.slot import slot
with slot("model", max=1, wait_s=1) as s:
    print("work ran, held:", s.held)
"""


def _run(tmp_path: Path, setup: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no GOVERNOR_API_KEY, no GOV_DIR
    return subprocess.run(
        [sys.executable, "-c", WORK.format(setup=setup)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_governord_unreachable_and_no_state_dir_runs_the_work_logged_once(
    tmp_path: Path,
) -> None:
    not_a_dir = tmp_path / "gov"
    not_a_dir.write_text("")
    out = _run(tmp_path, GOVERNOR_ADDR=f"127.0.0.1:{free_port()}", GOV_DIR=str(not_a_dir))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "work ran, held: False\n"
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("gov: fail-open: running the block without a 'model' slot:")
    assert "no usable state directory" in lines[0]


@pytest.mark.slow
def test_a_governor_that_cannot_import_runs_the_work_logged_once(tmp_path: Path) -> None:
    out = _run(tmp_path, setup="sys.modules['grpc'] = None  # as if grpc were not installed")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "work ran, held: False\n"
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert "the governor could not load (ModuleNotFoundError" in lines[0]


def test_a_bad_argument_is_still_the_callers_mistake() -> None:
    from governor.slot import slot
    from ratemesh.errors import ConfigError

    with pytest.raises(ConfigError, match="^name: 'Bad Name' is not a slot name"):
        slot("Bad Name")

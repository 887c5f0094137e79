"""`gov run` with governord configured: the slot is a lease, so `--max` holds across
machines (two state directories stand for two machines); without an answer from governord
it falls back to the machine's own slots and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.governor._daemon import KEYS, Daemon, free_port, running

pytestmark = pytest.mark.slow

GOV = [sys.executable, "-m", "governor.gov_cli"]


@pytest.fixture
def governord(tmp_path: Path) -> Iterator[Daemon]:
    yield from running("sqlite", tmp_path)


def _env(tmp_path: Path, machine: str, addr: str) -> dict[str, str]:
    return {
        **os.environ,
        "GOV_DIR": str(tmp_path / machine),
        "GOVERNOR_ADDR": addr,
        "GOVERNOR_API_KEY": KEYS["KEY_A"],
    }


def test_max_holds_across_machines(governord: Daemon, tmp_path: Path) -> None:
    runs = tmp_path / "running"
    runs.mkdir()
    body = (
        f"mkdir {runs}/$$ && ls {runs} | wc -l >> {tmp_path}/peaks && sleep 0.4 && rmdir {runs}/$$"
    )
    procs = [
        subprocess.Popen(
            [*GOV, "run", "--max", "2", "--name", "model", "--", "sh", "-c", body],
            env=_env(tmp_path, f"machine-{i % 2}", governord.addr),
            stderr=subprocess.PIPE,
        )
        for i in range(6)
    ]
    errs = []
    for p in procs:
        _, err = p.communicate(timeout=120)
        errs.append(err)
        assert p.returncode == 0, err
    peaks = [int(x) for x in (tmp_path / "peaks").read_text().split()]
    assert len(peaks) == 6 and max(peaks) <= 2, peaks
    assert not any(b"fail-open" in e or b"unreachable" in e for e in errs), errs


def test_no_answer_falls_back_to_this_machine_disclosed(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    out = subprocess.run(
        [*GOV, "run", "--max", "1", "--", "echo", "ran"],
        env=_env(tmp_path, "m", dead),
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout == b"ran\n"
    assert b"governord unreachable" in out.stderr and b"this machine only" in out.stderr
    log = (tmp_path / "m" / "gov.log").read_text()
    assert '"event": "governord_fallback"' in log


def test_a_429_on_one_machine_backs_off_another_through_governord(
    governord: Daemon, tmp_path: Path
) -> None:
    env_a = {**_env(tmp_path, "machine-a", governord.addr), "GOV_FLEET_COOLDOWN": "1"}
    env_b = {**_env(tmp_path, "machine-b", governord.addr), "GOV_FLEET_COOLDOWN": "1"}
    hit = subprocess.run(
        [*GOV, "run", "--", "sh", "-c", "echo 'status 429' >&2"], env=env_a, capture_output=True
    )
    assert b"cooldown of 90s for every machine" in hit.stderr, hit.stderr
    t0 = time.monotonic()
    other = subprocess.run(
        [*GOV, "run", "--priority", "high", "--wait-s", "1", "--", "true"],
        env=env_b,
        capture_output=True,
        timeout=60,
    )
    assert time.monotonic() - t0 >= 1.0  # machine b waited out the fleet's cooldown
    assert b"fail-open" in other.stderr and b"cooldown" in other.stderr
    status = json.loads(
        subprocess.run([*GOV, "status", "--json"], env=env_b, capture_output=True).stdout
    )
    assert 80 < status["cooldown_remaining_s"] <= 90
    cleared = subprocess.run([*GOV, "cooldown", "0"], env=env_a, capture_output=True, text=True)
    assert "on every machine" in cleared.stdout
    again = subprocess.run(
        [*GOV, "run", "--wait-s", "5", "--", "true"], env=env_b, capture_output=True, timeout=60
    )
    assert again.returncode == 0 and b"fail-open" not in again.stderr

"""`gov run` with governord configured: the slot is a lease, so `--max` holds across
machines (two state directories stand for two machines); a configured governord that is wrong
or silent stops gov in one line; only without one does gov use the machine's own slots."""

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


def test_no_answer_from_a_configured_governord_is_one_line_and_exit_69(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    out = subprocess.run(
        [*GOV, "run", "--max", "1", "--", "echo", "ran"],
        env=_env(tmp_path, "m", dead),
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 69 and out.stdout == b"", out
    (line,) = out.stderr.decode().splitlines()
    assert dead in line and "GOVERNOR_ADDR" in line and "does not answer" in line, line


@pytest.mark.parametrize(
    ("addr", "key", "names"),
    [
        ("{addr}", "not-a-key-of-any-tenant", "GOVERNOR_API_KEY"),
        ("http://{addr}", KEYS["KEY_A"], "GOVERNOR_ADDR"),
    ],
)
def test_a_wrong_key_or_a_url_is_one_line_and_exit_2(
    governord: Daemon, tmp_path: Path, addr: str, key: str, names: str
) -> None:
    env = {**_env(tmp_path, "m", addr.format(addr=governord.addr)), "GOVERNOR_API_KEY": key}
    for argv in (["run", "--", "echo", "ran"], ["status"]):
        out = subprocess.run([*GOV, *argv], env=env, capture_output=True, timeout=60)
        assert out.returncode == 2 and out.stdout == b"", out
        (line,) = out.stderr.decode().splitlines()
        assert line.startswith(f"gov: {names}: ") and "Traceback" not in line, line


def test_status_names_the_holders_of_held_leases(governord: Daemon, tmp_path: Path) -> None:
    env = _env(tmp_path, "m", governord.addr)
    gate = tmp_path / "go"
    body = f"touch {tmp_path}/held.$$; while [ ! -e {gate} ]; do sleep 0.05; done"
    procs = [
        subprocess.Popen(
            [*GOV, "run", "--max", "2", "--name", "model", "--", "sh", "-c", body], env=env
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("held.*"))) < 2:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        out = subprocess.run([*GOV, "status", "--json"], env=env, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        s = json.loads(out.stdout)
        assert s["fleet"]["model"] == {"max": 2, "held": 2, "waiting": 0}, s
        holders = s["slots"]["model"]["holders"]
        assert sorted(h["pid"] for h in holders) == sorted(p.pid for p in procs), holders
        assert all(h["slot"] == "lease" and h["command"].startswith("sh -c") for h in holders)
    finally:
        gate.touch()
        for p in procs:
            assert p.wait(60) == 0
    s = json.loads(subprocess.run([*GOV, "status", "--json"], env=env, capture_output=True).stdout)
    assert s["slots"]["model"]["holders"] == [] and s["fleet"]["model"]["held"] == 0


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

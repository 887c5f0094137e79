"""`gov run` as a shell user runs it: real processes, real signals, a real state directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

GOV = [sys.executable, "-m", "governor.gov_cli"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["GOV_DIR"] = str(tmp_path / "gov")
    env.pop("GOVERNOR_ADDR", None)
    return env


def _status(env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([*GOV, "status", "--json"], env=env, capture_output=True, check=True)
    data = json.loads(out.stdout)
    assert isinstance(data, dict)
    return data


def test_six_callers_never_run_more_than_two_at_once(tmp_path: Path) -> None:
    env = _env(tmp_path)
    runs = tmp_path / "running"
    runs.mkdir()
    # Each command marks itself running, records how many are, and leaves after a while.
    body = (
        f"mkdir {runs}/$$ && ls {runs} | wc -l >> {tmp_path}/peaks && sleep 0.4 && rmdir {runs}/$$"
    )
    procs = [
        subprocess.Popen(
            [*GOV, "run", "--max", "2", "--name", "burst", "--", "sh", "-c", body], env=env
        )
        for _ in range(6)
    ]
    codes = [p.wait(timeout=60) for p in procs]
    assert codes == [0] * 6
    peaks = [int(x) for x in (tmp_path / "peaks").read_text().split()]
    assert len(peaks) == 6 and max(peaks) <= 2, peaks
    assert _status(env)["slots"] == {"burst": {"max": 2, "holders": []}}


def test_exit_status_output_and_signals_pass_through(tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = subprocess.run(
        [*GOV, "run", "--", "sh", "-c", "printf out; printf err >&2; exit 7"],
        env=env,
        capture_output=True,
    )
    assert (out.returncode, out.stdout, out.stderr) == (7, b"out", b"err")
    p = subprocess.Popen(
        [
            *GOV,
            "run",
            "--",
            sys.executable,
            "-c",
            "import time; print('up', flush=True); time.sleep(30)",
        ],
        env=env,
        stdout=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stdout.readline() == b"up\n"
    p.send_signal(signal.SIGTERM)  # passed to the command, which dies of it; so does gov
    assert p.wait(timeout=20) == -signal.SIGTERM
    p.stdout.close()
    assert _status(env)["slots"]["default"]["holders"] == []


def test_a_holder_killed_with_sigkill_frees_its_slot_within_its_ttl(tmp_path: Path) -> None:
    env = _env(tmp_path)
    ttl = 3.0
    holder = subprocess.Popen(
        [*GOV, "run", "--max", "1", "--ttl-s", str(ttl), "--", "sleep", "60"], env=env
    )
    deadline = time.monotonic() + 20
    while not _status(env)["slots"].get("default", {}).get("holders"):
        assert time.monotonic() < deadline, "the holder never took its slot"
        time.sleep(0.05)
    holder.kill()  # gov dies; its `sleep 60` lives on, orphaned, keeping the slot until the TTL
    holder.wait()
    killed = time.monotonic()
    waiter = subprocess.run(
        [*GOV, "run", "--max", "1", "--wait-s", "30", "--", "true"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    freed_after = time.monotonic() - killed
    assert waiter.returncode == 0 and b"fail-open" not in waiter.stderr
    assert freed_after <= ttl + 2.0, freed_after  # within its TTL (plus poll and start-up)
    log = (tmp_path / "gov" / "gov.log").read_text()
    assert '"event": "slot_reaped"' in log
    subprocess.run(["pkill", "-f", "^sleep 60$"], check=False)


def test_fail_open_after_the_window_is_logged(tmp_path: Path) -> None:
    env = _env(tmp_path)
    holder = subprocess.Popen([*GOV, "run", "--max", "1", "--", "sleep", "20"], env=env)
    try:
        deadline = time.monotonic() + 20
        while not _status(env)["slots"].get("default", {}).get("holders"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        late = subprocess.run(
            [*GOV, "run", "--max", "1", "--wait-s", "0.5", "--", "echo", "ran"],
            env=env,
            capture_output=True,
            timeout=30,
        )
        assert late.returncode == 0 and late.stdout == b"ran\n"  # it ran anyway
        assert b"fail-open" in late.stderr and b"no slot free" in late.stderr
        events = [
            json.loads(line) for line in (tmp_path / "gov" / "gov.log").read_text().splitlines()
        ]
        assert any(e["event"] == "fail_open" and e["command"] == "echo ran" for e in events)
    finally:
        holder.terminate()
        holder.wait()


def test_a_429_in_the_output_makes_the_next_run_wait(tmp_path: Path) -> None:
    env = _env(tmp_path)
    hit = subprocess.run(
        [*GOV, "run", "--", "sh", "-c", "echo 'HTTP/1.1 429 Too Many Requests' >&2; exit 1"],
        env=env,
        capture_output=True,
    )
    assert hit.returncode == 1 and b"cooldown of 90s" in hit.stderr
    s = _status(env)
    assert 80 < float(s["cooldown_remaining_s"]) <= 90
    t0 = time.monotonic()
    nxt = subprocess.run(
        [*GOV, "run", "--priority", "high", "--wait-s", "1", "--", "true"],
        env=env,
        capture_output=True,
    )
    assert time.monotonic() - t0 >= 1.0  # it waited out its window first
    assert nxt.returncode == 0 and b"fail-open" in nxt.stderr and b"cooldown" in nxt.stderr
    assert subprocess.run([*GOV, "cooldown", "0"], env=env).returncode == 0
    assert _status(env)["cooldown_remaining_s"] == 0


def test_mistakes_are_one_line(tmp_path: Path) -> None:
    env = _env(tmp_path)
    for args in (
        ["run", "--max", "0", "--", "true"],
        ["run", "--name", "A/B", "--", "true"],
        ["frob"],
    ):
        out = subprocess.run([*GOV, *args], env=env, capture_output=True, text=True)
        assert out.returncode == 2, args
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    missing = subprocess.run([*GOV, "run", "--", "/no/such/cmd"], env=env, capture_output=True)
    assert missing.returncode == 127 and b"cannot run" in missing.stderr


def test_wrap_prints_a_line_that_runs_under_gov(tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = subprocess.run(
        [*GOV, "wrap", "--max", "3", "echo a | tr a b"], env=env, capture_output=True, text=True
    )
    line = out.stdout.strip()
    assert line.startswith("gov run --name default --max 3") and line.endswith("'echo a | tr a b'")
    ran = subprocess.run(
        line.replace("gov run", " ".join(GOV) + " run", 1), shell=True, env=env, capture_output=True
    )
    assert ran.stdout == b"b\n"

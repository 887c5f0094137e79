"""gov's state directory against another user on the same machine: real `gov` processes, a
real second user (`nobody`) planting state in a shared sticky directory like /tmp.

A directory another user made first is refused in one line, never read (its cooldowns and
slots would make the victim wait); links planted for the log are not followed; the directory
and the log are the user's alone (docs/gov.md)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

GOV = [sys.executable, "-m", "governor.gov_cli"]
ATTACKER = "nobody"
# A victim that believed the planted state would wait this long for the planted cooldown,
# then fail open; one that refuses it never waits.
VICTIM_WAIT_S = 3
TIMEOUT_S = 120


def _attacker_uid() -> int:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second user")
    try:
        return pwd.getpwnam(ATTACKER).pw_uid
    except KeyError:
        pytest.skip(f"no user {ATTACKER!r} on this machine")


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory like /tmp: world-writable with the sticky bit, reachable by anyone."""
    d = Path(tempfile.mkdtemp(prefix="ratemesh-shared-", dir="/tmp"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _env(tmpdir: Path, gov_dir: Path | None = None) -> dict[str, str]:
    """gov's environment with no XDG_RUNTIME_DIR: the default state dir is under `tmpdir`."""
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "GOV_DIR")}
    env.pop("GOVERNOR_ADDR", None)
    env["TMPDIR"] = str(tmpdir)
    if gov_dir is not None:
        env["GOV_DIR"] = str(gov_dir)
    return env


def _as_attacker(script: str, uid: int) -> None:
    """Run `script` (sh) as the second user, as that user would from a shell."""
    subprocess.run(
        ["sh", "-c", script], user=uid, group=uid, extra_groups=[], check=True, timeout=TIMEOUT_S
    )


def _umask_022() -> None:
    os.umask(0o022)


def _gov(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GOV, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=_umask_022,
    )


def _victim_run(env: dict[str, str], marker: Path) -> subprocess.CompletedProcess[str]:
    return _gov(
        "run", "--max", "1", "--wait-s", str(VICTIM_WAIT_S), "--", "touch", str(marker), env=env
    )


def _planted_cooldown() -> str:
    return json.dumps({"until": time.time() + 3600, "reason": "planted", "set_at": time.time()})


def test_a_state_dir_another_user_made_first_is_refused(shared_tmp: Path) -> None:
    uid = _attacker_uid()
    victim_dir = shared_tmp / f"ratemesh-gov-{os.getuid()}"
    env = _env(shared_tmp)
    # Baseline, same test: the victim's own fresh directory, no waiting, no fail-open.
    baseline = _victim_run(_env(shared_tmp, shared_tmp / "own"), shared_tmp / "ran-baseline")
    assert baseline.returncode == 0, baseline.stderr
    assert "fail-open" not in baseline.stderr
    assert (shared_tmp / "ran-baseline").exists()

    # The attacker makes the victim's default directory first: an hour's cooldown, a log link.
    _as_attacker(
        f"mkdir -m 777 {victim_dir} && printf '%s' '{_planted_cooldown()}' > "
        f"{victim_dir}/cooldown.json && ln -s /tmp/ratemesh-stolen-log {victim_dir}/gov.log",
        uid,
    )
    planted = sorted(p.name for p in victim_dir.iterdir())
    got = _victim_run(env, shared_tmp / "ran-attacked")
    # Refused in one line that names the directory, before anything in it is believed.
    assert got.returncode == 2, (got.returncode, got.stderr)
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and "GOV_DIR" in lines[0] and str(victim_dir) in lines[0], lines
    assert "Traceback" not in got.stderr and "fail-open" not in got.stderr
    assert not (shared_tmp / "ran-attacked").exists()
    assert sorted(p.name for p in victim_dir.iterdir()) == planted  # nothing written there
    assert victim_dir.stat().st_uid == uid
    # gov status refuses it too, rather than showing the planted cooldown as the victim's.
    st = _gov("status", "--json", env=env)
    assert st.returncode == 2 and "GOV_DIR" in st.stderr and st.stdout == ""


def test_a_planted_link_in_place_of_the_state_dir_is_refused(shared_tmp: Path) -> None:
    uid = _attacker_uid()
    victim_dir = shared_tmp / f"ratemesh-gov-{os.getuid()}"
    theirs = shared_tmp / "attacker-state"
    _as_attacker(
        f"mkdir -m 700 {theirs} && printf '%s' '{_planted_cooldown()}' > {theirs}/cooldown.json"
        f" && ln -s {theirs} {victim_dir}",
        uid,
    )
    got = _victim_run(_env(shared_tmp), shared_tmp / "ran")
    assert got.returncode == 2, (got.returncode, got.stderr)
    assert "symbolic link" in got.stderr and len(got.stderr.strip().splitlines()) == 1
    assert "fail-open" not in got.stderr and not (shared_tmp / "ran").exists()


def test_a_log_link_is_not_followed(tmp_path: Path) -> None:
    own = tmp_path / "gov"
    own.mkdir(mode=0o700)
    target = tmp_path / "someone-elses-file"
    target.write_text("theirs\n")
    (own / "gov.log").symlink_to(target)
    env = _env(tmp_path, own)
    got = _gov("cooldown", "1", env=env)  # logs a cooldown event
    assert got.returncode == 0, got.stderr
    assert target.read_text() == "theirs\n"
    assert (own / "gov.log").is_symlink()


def test_the_state_dir_and_log_are_the_users_alone(tmp_path: Path) -> None:
    env = _env(tmp_path)
    token = "Bearer 0123456789abcdef0123456789abcdef"
    got = _gov(
        "run", "--max", "1", "--", "sh", "-c", f"echo '{token}' >/dev/null; echo 429", env=env
    )
    assert got.returncode == 0, got.stderr  # 429 in the output: a logged cooldown
    root = tmp_path / f"ratemesh-gov-{os.getuid()}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    log = root / "gov.log"
    assert token in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    # An older gov's 0755 directory and 0644 log, the user's own: closed on the next use.
    os.chmod(root, 0o755)
    os.chmod(log, 0o644)
    assert _gov("cooldown", "0", env=env).returncode == 0
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(log.stat().st_mode) == 0o600

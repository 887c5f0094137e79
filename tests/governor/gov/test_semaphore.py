"""The machine-local semaphore: claims are exclusive, dead holders are reaped, live ones
never are, and a reaper that races a new claim puts it back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from governor.gov import Cooldown, GovDir, Holder, LocalSemaphore, acquire_slot, check_name
from governor.gov._semaphore import alive, process_start
from governor.gov._slots import Attempt
from ratemesh.errors import ConfigError


def _root(tmp_path: Path) -> GovDir:
    return GovDir(tmp_path / "gov")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_claims_are_exclusive_up_to_max(tmp_path: Path) -> None:
    sem = LocalSemaphore(_root(tmp_path), "db")
    claims = [sem.try_claim(3, Holder.here(f"c{i}", 60)) for i in range(4)]
    assert [c is not None for c in claims] == [True, True, True, False]
    assert sorted(c.index for c in claims if c) == [0, 1, 2]
    assert len(sem.holders()) == 3
    first = claims[0]
    assert first is not None and sem.release(first)
    again = sem.try_claim(3, Holder.here("c4", 60))
    assert again is not None and again.index == 0
    assert not sem.release(first)  # released twice: not ours any more


def test_a_dead_holder_is_reaped_at_once(tmp_path: Path) -> None:
    root = _root(tmp_path)
    sem = LocalSemaphore(root, "db")
    dead = replace(Holder.here("gone", 3600), pid=_dead_pid(), pid_start=None)
    assert sem.try_claim(1, dead) is not None
    live = sem.try_claim(1, Holder.here("next", 60))
    assert live is not None  # the dead holder's slot was reaped for it
    assert "slot_reaped" in root.log_file.read_text()


def test_a_reused_pid_is_not_the_holder(tmp_path: Path) -> None:
    sem = LocalSemaphore(_root(tmp_path), "db")
    me = Holder.here("me", 3600)
    assert me.pid_start is not None and alive(me.pid, me.pid_start)
    impostor = replace(me, pid_start=me.pid_start - 1, token="other")  # same pid, other start
    assert not alive(impostor.pid, impostor.pid_start)
    assert sem.try_claim(1, impostor) is not None
    assert sem.try_claim(1, Holder.here("next", 60)) is not None


def test_a_live_holder_is_kept_until_its_ttl(tmp_path: Path) -> None:
    sem = LocalSemaphore(_root(tmp_path), "db")
    held = sem.try_claim(1, Holder.here("long", 2.0))
    assert held is not None
    assert sem.try_claim(1, Holder.here("next", 60)) is None
    old = time.time() - 5
    os.utime(held.path, (old, old))  # no heartbeat for longer than the TTL
    assert sem.try_claim(1, Holder.here("next", 60)) is not None
    assert not sem.heartbeat(held)


def test_a_command_that_outlives_its_holder_keeps_the_slot(tmp_path: Path) -> None:
    sem = LocalSemaphore(_root(tmp_path), "db")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        held = sem.try_claim(1, replace(Holder.here("x", 3600), pid=_dead_pid(), pid_start=None))
        assert held is not None
        sem.note_child(held, child.pid)
        assert sem.try_claim(1, Holder.here("next", 60)) is None  # the command still runs
    finally:
        child.kill()
        child.wait()
    assert sem.try_claim(1, Holder.here("next", 60)) is not None


def test_a_reaper_that_took_a_fresh_claim_puts_it_back(tmp_path: Path) -> None:
    root = _root(tmp_path)
    sem = LocalSemaphore(root, "db")
    fresh = sem.try_claim(1, Holder.here("fresh", 60))
    assert fresh is not None
    # A reaper that inspected an older, dead record and then renamed this fresh one away.
    assert not sem._take_away(fresh.path, "the-dead-one")
    assert fresh.path.exists() and sem.heartbeat(fresh)


def test_process_start_reads_this_process() -> None:
    assert process_start(os.getpid()) == process_start(os.getpid()) is not None


def test_names_are_checked() -> None:
    for bad in ("", "Upper", "a/b", "../x", "x" * 64):
        with pytest.raises(ConfigError, match="name"):
            check_name(bad)


def test_fail_open_after_the_window_is_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root(tmp_path)
    sem = LocalSemaphore(root, "api")
    assert sem.try_claim(1, Holder.here("holder", 60)) is not None
    got = acquire_slot("api", 1, wait_s=0.2, command="late", root=root)
    assert got.claim is None and got.fail_open and "no slot free" in got.fail_open
    assert got.waited_s >= 0.2
    assert "fail-open" in capsys.readouterr().err
    assert '"event": "fail_open"' in root.log_file.read_text()


def test_a_cooldown_holds_callers_then_fails_open(tmp_path: Path) -> None:
    root = _root(tmp_path)
    Cooldown(root).trip(30)
    got = acquire_slot("api", 2, priority="high", wait_s=0.3, root=root)
    assert got.claim is None and got.fail_open is not None and "cooldown" in got.fail_open
    Cooldown(root).set(0)
    assert acquire_slot("api", 2, wait_s=0.3, root=root).claim is not None


def test_a_named_cooldown_applies_to_its_name_only(tmp_path: Path) -> None:
    root = _root(tmp_path)
    Cooldown(root).trip(30, "model")
    assert Cooldown(root).remaining_s("model") > 25
    assert Cooldown(root).remaining_s("db") == 0
    assert acquire_slot("db", 1, wait_s=0.1, root=root).claim is not None


def test_trip_only_extends(tmp_path: Path) -> None:
    c = Cooldown(_root(tmp_path))
    c.trip(60)
    c.trip(5)
    assert c.remaining_s() > 55
    c.set(5)
    assert c.remaining_s() <= 5


def test_bad_arguments_change_nothing(tmp_path: Path) -> None:
    root = _root(tmp_path)
    for kwargs in ({"max_slots": 0}, {"priority": "urgent"}, {"wait_s": -1.0}):
        args = {"max_slots": 1, **kwargs}
        with pytest.raises(ConfigError):
            Attempt("db", args.pop("max_slots"), root=root, **args)  # type: ignore[arg-type]
    assert not (root.root / "slots" / "db").exists() or not any(
        p.name.isdigit() for p in (root.root / "slots" / "db").iterdir()
    )

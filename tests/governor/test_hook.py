"""`governord hook` against a real governord: each tool call is charged once, a retried
hook is not charged again, subagents are counted and charged along the run, a spent
budget blocks with exit 2 and one line, and no answer from governord fails closed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from governor.hook import request_id_for
from tests.governor._daemon import KEYS, Daemon, free_port, running


def _hook(addr: str, payload: Any, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GOVERNOR_ADDR": addr, "GOVERNOR_API_KEY": KEYS["KEY_A"]}
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return subprocess.run(
        [sys.executable, "-m", "governor.cli", "hook", *flags],
        input=text,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _call(session: str, use: str, **extra: Any) -> dict[str, Any]:
    return {
        "session_id": session,
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "ls"},
        "tool_use_id": use,
        **extra,
    }


def test_request_ids_follow_the_call() -> None:
    a = _call("s", "toolu_1")
    assert request_id_for(a, "call") == request_id_for(dict(a), "call")
    assert request_id_for(a, "call") != request_id_for(_call("s", "toolu_2"), "call")
    no_id = {k: v for k, v in a.items() if k != "tool_use_id"}
    assert request_id_for(no_id, "call") == request_id_for(dict(no_id), "call")


@pytest.fixture
def governord(tmp_path: Path) -> Iterator[Daemon]:
    yield from running("sqlite", tmp_path)


@pytest.mark.slow
def test_the_hook_blocks_at_the_budget_and_never_double_charges(governord: Daemon) -> None:
    addr = governord.addr
    for i in range(3):
        out = _hook(addr, _call("run-1", f"toolu_{i}"), "--tool-calls", "3")
        assert out.returncode == 0, out.stderr
    again = _hook(addr, _call("run-1", "toolu_2"), "--tool-calls", "3")  # a retried hook
    assert again.returncode == 0, again.stderr
    spent = _hook(addr, _call("run-1", "toolu_3"), "--tool-calls", "3")
    assert spent.returncode == 2
    line = spent.stderr.strip()
    assert len(line.splitlines()) == 1
    assert 'the tool_calls budget of "claude:run-1" is spent (3 of 3 used)' in line
    other = _hook(addr, _call("run-2", "toolu_0"), "--tool-calls", "3")  # its own run
    assert other.returncode == 0


@pytest.mark.slow
def test_a_time_budget_counts_from_the_runs_first_call(governord: Daemon) -> None:
    """`--minutes` is the run's budget from its first call (docs/gov.md's own command): the
    calls within it run, and once it has passed the next is blocked with the time budget's
    line. The API reads a deadline as an instant (epoch ms); a duration sent as one was long
    past, and every call was blocked from the first."""
    import time

    addr = governord.addr
    flags = ("--tool-calls", "500", "--subagents", "20", "--minutes", "60")
    for i in range(3):
        out = _hook(addr, _call("run-m", f"toolu_m{i}"), *flags)
        assert out.returncode == 0, out.stderr
    short = ("--tool-calls", "500", "--minutes", "0.03")  # 1.8 s
    first = _hook(addr, _call("run-t", "toolu_t0"), *short)
    assert first.returncode == 0, first.stderr
    time.sleep(2.5)
    late = _hook(addr, _call("run-t", "toolu_t1"), *short)
    assert late.returncode == 2, late.stderr
    assert 'the time budget of "claude:run-t" is spent' in late.stderr, late.stderr
    assert len(late.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_subagents_are_child_nodes_and_counted(governord: Daemon) -> None:
    addr = governord.addr
    flags = ("--tool-calls", "100", "--subagents", "2")
    for agent in ("a1", "a1", "a2"):
        out = _hook(
            addr, _call("run-s", f"t-{agent}-{os.urandom(4).hex()}", agent_id=agent), *flags
        )
        assert out.returncode == 0, out.stderr
    third = _hook(addr, _call("run-s", "t-a3", agent_id="a3"), *flags)
    assert third.returncode == 2 and "subagents budget" in third.stderr


@pytest.mark.slow
def test_no_answer_fails_closed_and_bad_input_blocks() -> None:
    dead = f"127.0.0.1:{free_port()}"
    out = _hook(dead, _call("run-x", "t1"), "--timeout-s", "0.5")
    assert out.returncode == 2 and "did not answer" in out.stderr and "fails closed" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    for bad in ("not json", "[1]", json.dumps({"tool_name": "Bash"})):
        out = _hook(dead, bad)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1

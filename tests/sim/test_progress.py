"""Progress on stderr for long runs: drawn when stderr is a terminal, never with --json or
into a pipe, and stdout stays one parseable JSON object either way (a pseudo-terminal
stands for the operator's)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MESH = [sys.executable, "-m", "mesh.cli"]


def run_on_a_terminal(args: list[str]) -> tuple[str, str, int]:
    """`mesh ARGS` with stderr on a pseudo-terminal and stdout on a pipe."""
    main, sub = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    p = subprocess.Popen([*MESH, *args], stdout=subprocess.PIPE, stderr=sub, cwd=ROOT, env=env)
    os.close(sub)
    err = b""
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    assert p.stdout is not None
    with p.stdout:
        out = p.stdout.read().decode()
    os.close(main)
    return out, err.decode(errors="replace"), p.wait(timeout=60)


@pytest.mark.slow
def test_a_sweep_draws_progress_on_a_terminal_and_stdout_stays_json() -> None:
    args = ["sim", "sweep", "--scenarios", "noisy-neighbour", "--seeds", "1"]
    out, err, code = run_on_a_terminal(args)
    assert code == 0, err
    assert json.loads(out)["scenarios"]["noisy-neighbour"]["mesh"]["runs"] == 1
    assert "mesh sim sweep" in err and "noisy-neighbour seed" in err
    run = ["sim", "run", "--scenario", "noisy-neighbour", "--duration", "1", "--json"]
    out, err, code = run_on_a_terminal(run)
    assert code == 0 and json.loads(out)["scenario"] == "noisy-neighbour"
    assert "mesh sim run" not in err  # --json: nothing drawn


@pytest.mark.slow
def test_a_run_into_a_pipe_draws_nothing() -> None:
    p = subprocess.run(
        [*MESH, "sim", "run", "--scenario", "noisy-neighbour", "--duration", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["scenario"] == "noisy-neighbour"
    assert "\x1b[" not in p.stderr and "mesh sim run" not in p.stderr

"""Helpers shared by the cluster bench and the node tests: free ports, configs, children."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from ratemesh.ports import free_port  # bench's callers and the tests import it from here

__all__ = [
    "free_port",
    "write_config",
    "spawn",
    "go",
    "read_ready",
    "stop",
    "HOT",
    "cluster_config",
]

HOT: dict[str, Any] = {
    "tenant_id": "hot",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 2000,
    "global_burst": 200,
    "local_burst_cap": 40,
}
DEFAULT: dict[str, Any] = {
    "tenant_id": "*",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 50,
    "global_burst": 10,
    "local_burst_cap": 4,
}


PROBE: dict[str, Any] = {
    "tenant_id": "probe",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 10**12,
    "global_burst": 10**12,
    "local_burst_cap": 10**12,
}


def cluster_config(
    members: dict[str, str],
    *,
    policies: list[dict[str, Any]] | None = None,
    membership: dict[str, Any] | None = None,
    core: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "membership": membership or {"source": "static", "members": members},
        "policies": {"inline": policies if policies is not None else [HOT, DEFAULT, PROBE]},
        "core": core or {},
        "shutdown_drain_ms": 300,
    }


def write_config(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def spawn(args: list[str], *, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    e = dict(os.environ, PYTHONHASHSEED="0", **(env or {}))
    return subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=e,
    )


def go(procs: list[subprocess.Popen[str]], *, lead_s: float = 0.5) -> float:
    """Tell ready workers (started with `--start-at 0`) when to start: all at once, soon."""
    start_at = time.time() + lead_s
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{start_at}\n")
        p.stdin.flush()
    return start_at


_LEFTOVER: dict[int, bytes] = {}  # bytes read past a line, per child pid
RESULT_FILE = "result_file"


def watchdog(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    """If this child still runs after `seconds`, write every asyncio task's stack and every
    thread's to stderr and exit 3: a hung child then fails its test with the place it hung
    (`read_ready` reports a dead child's stderr), not with silence."""
    import faulthandler
    import threading

    def fire() -> None:
        print(f"watchdog: still running after {seconds:.0f} s", file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr)
        print("tasks:", file=sys.stderr)  # last: the test reports the end of stderr
        for task in list(asyncio.all_tasks(loop)):  # racy, but only ever read once, here
            task.print_stack(file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()


def print_result(result: dict[str, Any]) -> None:
    """A child's result for `read_ready`: through a file, as the line for it over a pipe
    has been seen to arrive cut at a pipe-buffer boundary when it is hundreds of KiB."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="ratemesh-result-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(result, f)
    print(json.dumps({RESULT_FILE: path}), flush=True)


def read_ready(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> dict[str, Any]:
    """The next stdout line a child prints (a JSON object): its "ready" line, or its result.

    Read with os.read and select rather than the pipe's file object, whose own buffer
    select cannot see. A line naming a result file (`print_result`) is replaced by it.
    """
    import selectors

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    buf = _LEFTOVER.pop(proc.pid, b"")
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while True:
            nl = buf.find(b"\n")
            if nl >= 0:
                line, buf = buf[:nl], buf[nl + 1 :]
                if buf:
                    _LEFTOVER[proc.pid] = buf
                out = json.loads(line)
                assert isinstance(out, dict)
                if set(out) == {RESULT_FILE}:  # a large result, passed in a file
                    path = Path(out[RESULT_FILE])
                    out = json.loads(path.read_text())
                    path.unlink()
                    assert isinstance(out, dict)
                return out
            if time.monotonic() >= deadline:
                break
            if not sel.select(timeout=0.1):
                if proc.poll() is not None and not sel.select(timeout=0):
                    break
                continue
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                break
            buf += chunk
    finally:
        sel.close()
    err = proc.stderr.read() if proc.stderr and proc.poll() is not None else ""
    raise RuntimeError(f"child did not become ready (rc={proc.poll()}): {err[-2000:]}")


def stop(proc: subprocess.Popen[str], *, kill: bool = False, timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            f.close()

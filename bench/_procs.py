"""Helpers shared by the cluster bench and the node tests: free ports, configs, children."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

__all__ = ["free_port", "write_config", "spawn", "go", "read_ready", "stop", "HOT",
           "cluster_config"]

HOT: dict[str, Any] = {"tenant_id": "hot", "metric": "read_iops", "generation": 1,
                       "target_rate": 2000, "global_burst": 200, "local_burst_cap": 40}
DEFAULT: dict[str, Any] = {"tenant_id": "*", "metric": "read_iops", "generation": 1,
                           "target_rate": 50, "global_burst": 10, "local_burst_cap": 4}


PROBE: dict[str, Any] = {"tenant_id": "probe", "metric": "read_iops", "generation": 1,
                         "target_rate": 10**12, "global_burst": 10**12,
                         "local_burst_cap": 10**12}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_config(members: dict[str, str], *, policies: list[dict[str, Any]] | None = None,
                   membership: dict[str, Any] | None = None,
                   core: dict[str, Any] | None = None) -> dict[str, Any]:
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
    return subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)


def go(procs: list[subprocess.Popen[str]], *, lead_s: float = 0.5) -> float:
    """Tell ready workers (started with `--start-at 0`) when to start: all at once, soon."""
    start_at = time.time() + lead_s
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{start_at}\n")
        p.stdin.flush()
    return start_at


def read_ready(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> dict[str, Any]:
    """The first stdout line a child prints once it serves (a JSON object)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if sel.select(timeout=0.1):
            line = proc.stdout.readline()
            if not line:
                break
            out = json.loads(line)
            assert isinstance(out, dict)
            return out
        if proc.poll() is not None:
            break
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

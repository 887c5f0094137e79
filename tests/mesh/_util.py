"""Small helpers for the node tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench._procs import free_port

__all__ = [
    "until",
    "wait_for",
    "static_nodes",
    "POLICY",
    "http_get",
    "require_binary",
    "run_mesh",
    "mesh_validate",
]

POLICY: dict[str, Any] = {
    "tenant_id": "acme",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 1000,
    "global_burst": 100,
    "local_burst_cap": 20,
}


async def until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        assert loop.time() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(0.005)


def wait_for(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.005)


def static_nodes(
    ids: list[str], policies: list[dict[str, Any]] | None = None, **extra: Any
) -> list[dict[str, Any]]:
    members = {m: f"127.0.0.1:{free_port()}" for m in ids}
    return [
        dict(
            {
                "member_id": m,
                "listen": members[m],
                "shutdown_drain_ms": 500,
                "membership": {"source": "static", "members": members},
                "policies": {"inline": policies if policies is not None else [POLICY]},
            },
            **extra,
        )
        for m in ids
    ]


def http_get(addr: str, path: str) -> httpx.Response:
    return httpx.get(f"http://{addr}{path}", timeout=5)


def require_binary(name: str, package: str) -> str:
    """A service binary's path. In CI (CI=true) a missing one fails the test; elsewhere it
    skips. Looks in the sbin directories too (dnsmasq lives there)."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed (CI installs Debian's {package})")
        pytest.skip(f"{name} is not installed (apt-get install {package})")
    return path


def run_mesh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mesh ARGS...` in a child process to its end (stdin closed), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "mesh.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def mesh_validate(config: Path) -> subprocess.CompletedProcess[str]:
    """`mesh validate --config F --json` as an operator runs it."""
    return run_mesh("validate", "--config", str(config), "--json")

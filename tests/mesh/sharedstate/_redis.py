"""Redis for the shared-state tests: the one on 127.0.0.1:6379, or a server a test starts
itself (to freeze with SIGSTOP, kill with SIGKILL and restart on the same port)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from bench._procs import free_port
from tests.mesh._util import require_binary

__all__ = ["SHARED", "RedisServer", "require_shared_redis", "unique", "redis_config"]

SHARED = "127.0.0.1:6379"


def require_shared_redis() -> redis.Redis:
    """The machine's Redis. Under CI=true a missing one fails the test; elsewhere it skips."""
    client = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=2, protocol=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        if os.environ.get("CI") == "true":
            pytest.fail(f"redis on {SHARED} is not answering (CI runs one): {exc}")
        pytest.skip(f"redis on {SHARED} is not answering: {exc}")
    return client


def unique(prefix: str = "t") -> str:
    """A tenant id no other run uses: the shared Redis keeps buckets between runs."""
    return f"{prefix}-{secrets.token_hex(6)}"


def redis_config(addr: str, policies: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "member_id": unique("m"),
        "shutdown_drain_ms": 100,
        "policies": {"inline": policies},
        "shared_state": {"redis": {"external": "allow", "addr": addr}},
        **extra,
    }


class RedisServer:
    """A redis-server of our own on a free port, no persistence: start, freeze, thaw,
    kill, start again on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.binary = require_binary("redis-server", "redis-server")
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, protocol=2)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.RedisError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise RuntimeError(f"redis-server on {self.port} did not start") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.thaw()
        self.kill()

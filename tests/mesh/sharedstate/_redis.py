"""Redis for the shared-state tests: the one on 127.0.0.1:6379, or a server a test starts
itself (to freeze with SIGSTOP, kill with SIGKILL and restart on the same port)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.redis import RedisServer
from tests.mesh._util import require_binary

__all__ = ["SHARED", "RedisServer", "own_server", "redis_config", "require_shared_redis", "unique"]

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


def own_server(workdir: Path) -> RedisServer:
    """A redis-server of the test's own (bench.redis's): a missing binary fails under
    CI=true and skips elsewhere."""
    return RedisServer(require_binary("redis-server", "redis-server"), workdir)

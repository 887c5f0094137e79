"""The real Redis on 127.0.0.1:6379: under CI=true a missing Redis fails the test,
elsewhere it skips."""

from __future__ import annotations

import os

import pytest
import redis

__all__ = ["connect", "text"]


def connect() -> redis.Redis:
    c = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=2)
    try:
        c.ping()
    except redis.RedisError as exc:
        c.close()
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis on 127.0.0.1:6379 is not answering: {exc}")
        pytest.skip(f"no Redis on 127.0.0.1:6379: {exc}")
    return c


def text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

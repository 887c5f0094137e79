"""The real Redis on 127.0.0.1:6379 for tests outside tests/mesh/sharedstate: the same
connection rule as there (under CI=true a missing Redis fails the test, elsewhere it skips)."""

from __future__ import annotations

import redis

from tests.mesh.sharedstate._redis import require_shared_redis

__all__ = ["connect", "text"]


def connect() -> redis.Redis:
    return require_shared_redis()


def text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

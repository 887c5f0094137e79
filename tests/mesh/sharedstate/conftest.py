from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.mesh.sharedstate._redis import RedisServer, own_server, require_shared_redis


@pytest.fixture
def shared_redis() -> Iterator[redis.Redis]:
    client = require_shared_redis()
    yield client
    client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = own_server(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()

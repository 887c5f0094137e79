"""Fixtures for the node tests: a real etcd, and a seed printed with every failure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mesh._etcd import EtcdServer


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path / "etcd-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()

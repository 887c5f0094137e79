"""The store-scheme table: every way a ``store:`` setting names a database, opened one way."""

from __future__ import annotations

from pathlib import Path

import pytest

import ratemesh.errors
from governor.bench import store as store_bench
from governor.config import GovernordConfig
from governor.store import (
    SCHEMES,
    EventLog,
    MemoryBackend,
    SqliteBackend,
    open_backend,
    parse_store,
)


@pytest.mark.parametrize(
    ("setting", "kind", "target"),
    [
        ("sqlite:governor.db", "sqlite", "governor.db"),
        ("sqlite:/var/lib/g.db", "sqlite", "/var/lib/g.db"),
        ("postgresql://u@h/db", "postgres", "postgresql://u@h/db"),
        ("postgres://u@h/db", "postgres", "postgres://u@h/db"),
        ("host=127.0.0.1 dbname=test", "postgres", "host=127.0.0.1 dbname=test"),
        ("memory:", "memory", ""),
    ],
)
def test_a_setting_names_one_scheme_and_its_target(setting: str, kind: str, target: str) -> None:
    scheme, found = parse_store(setting)
    assert (scheme.name, found) == (kind, target)
    assert GovernordConfig(store=setting).store_kind() == (kind, target)


@pytest.mark.parametrize("setting", ["mysql://h/db", "memory:extra", "", "governor.db"])
def test_an_unknown_setting_is_the_store_field_to_fix(setting: str) -> None:
    with pytest.raises(ratemesh.errors.ConfigError) as info:
        parse_store(setting)
    assert info.value.field == "store" and repr(setting) in info.value.problem


def test_the_memory_store_opens_like_the_others(tmp_path: Path) -> None:
    assert isinstance(open_backend("memory", ""), MemoryBackend)
    sqlite = open_backend("sqlite", str(tmp_path / "g.db"))
    try:
        assert isinstance(sqlite, SqliteBackend)
        EventLog(sqlite)  # migrates
    finally:
        sqlite.close()


def test_only_the_postgresql_scheme_is_shared_and_the_memory_one_is_not_durable() -> None:
    assert [n for n, s in SCHEMES.items() if s.shared] == ["postgres"]
    assert [n for n, s in SCHEMES.items() if not s.durable] == ["memory"]
    assert SCHEMES["postgres"].describe("postgresql://u:secret@h/db") == "postgresql"


def test_the_store_benchmark_measures_every_durable_scheme() -> None:
    assert set(store_bench.KINDS) == {n for n, s in SCHEMES.items() if s.durable}
    assert set(store_bench._RAW) == set(store_bench.KINDS)

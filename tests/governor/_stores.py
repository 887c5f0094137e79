"""Store fixtures shared by the governor store tests: SQLite files and PostgreSQL schemas.

PostgreSQL is the real server at 127.0.0.1:5432, database ``test``. Under ``CI=true`` a missing
server fails the test; elsewhere it skips. Every test gets its own schema, dropped afterwards.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from governor.store import Backend, PostgresBackend, SqliteBackend

PG_DSNS = (
    "host=127.0.0.1 port=5432 dbname=test user=postgres",
    "host=127.0.0.1 port=5432 dbname=test user=root",
)


def pg_dsn() -> str:
    """A DSN that connects, or fail (CI) / skip (elsewhere)."""
    errors = []
    for dsn in PG_DSNS:
        try:
            with psycopg.connect(dsn, connect_timeout=3):
                return dsn
        except psycopg.Error as exc:
            errors.append(f"{dsn}: {exc}")
    if os.environ.get("CI") == "true":
        pytest.fail("PostgreSQL is required under CI=true: " + "; ".join(errors))
    pytest.skip("PostgreSQL not reachable: " + "; ".join(errors))


@dataclass
class StoreTarget:
    kind: str
    target: str  # file path or DSN
    schema: str

    def backend(self, **kw: object) -> Backend:
        if self.kind == "sqlite":
            return SqliteBackend(self.target, **kw)  # type: ignore[arg-type]
        return PostgresBackend(self.target, schema=self.schema, **kw)  # type: ignore[arg-type]

    def execute(self, statement: str, params: tuple[object, ...] = ()) -> None:
        """Tamper with the record directly (tests of the loader's refusals)."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.target, isolation_level=None)
            try:
                conn.execute(statement.replace("{t}", "governor_").replace("%s", "?"), params)
            finally:
                conn.close()
        else:
            with psycopg.connect(self.target, autocommit=True) as pg:
                pg.execute(statement.replace("{t}", f'"{self.schema}".'), params)  # type: ignore[arg-type]


def make_target(kind: str, tmp_path: Path) -> Iterator[StoreTarget]:
    if kind == "sqlite":
        yield StoreTarget("sqlite", str(tmp_path / "governor.db"), "")
        return
    dsn = pg_dsn()
    schema = f"gov_test_{uuid.uuid4().hex[:12]}"
    yield StoreTarget("postgres", dsn, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[arg-type]

"""PostgreSQL for the shared-state tests: the server on 127.0.0.1:5432, database `test`
(trust auth). Under CI=true a missing server fails; elsewhere it skips. Each test gets its
own schema, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from tests.governor._stores import pg_dsn

__all__ = ["DSN_ENV", "pg_schema"]

DSN_ENV = "RATEMESH_TEST_PG_DSN"


@contextmanager
def pg_schema() -> Iterator[tuple[str, str]]:
    """(dsn, schema): a fresh schema name (the tier creates it), dropped at the end."""
    dsn = pg_dsn()
    schema = f"mesh_test_{uuid.uuid4().hex[:12]}"
    try:
        yield dsn, schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

"""PostgreSQL backend (psycopg 3): for a governord that serves several machines.

All tables live in one schema (default ``governor``), so tests and several deployments can share
a database. Commits use the server's default ``synchronous_commit = on``.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from ._backend import Batch, Rows
from ._errors import CommitFailed, StoreUnavailable

__all__ = ["PostgresBackend"]

MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE {s}.events (seq BIGINT PRIMARY KEY, kind TEXT NOT NULL,"
        " payload TEXT NOT NULL)",
        "CREATE TABLE {s}.snapshot (id INTEGER PRIMARY KEY CHECK (id = 1),"
        " seq BIGINT NOT NULL, state TEXT NOT NULL)",
        "CREATE TABLE {s}.tokens (sha256 TEXT PRIMARY KEY, session_id BIGINT NOT NULL)",
        "CREATE INDEX ON {s}.tokens (session_id)",
    ],
]


class PostgresBackend:
    name = "postgres"

    def __init__(
        self, dsn: str, *, schema: str = "governor", application_name: str = "governord"
    ) -> None:
        try:
            self._conn = psycopg.connect(dsn, autocommit=True, application_name=application_name)
        except psycopg.Error as exc:
            # not the DSN: it may carry a password; psycopg's message names the host and port
            raise StoreUnavailable(f"postgres: {exc}") from exc
        self.schema = schema
        self._s = sql.Identifier(schema)

    def _q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=self._s)

    def migrate(self) -> int:
        try:
            with self._conn.transaction():
                cur = self._conn.cursor()
                cur.execute(self._q("CREATE SCHEMA IF NOT EXISTS {s}"))
                cur.execute(
                    self._q("CREATE TABLE IF NOT EXISTS {s}.schema (version INTEGER NOT NULL)")
                )
                cur.execute(self._q("LOCK TABLE {s}.schema IN EXCLUSIVE MODE"))
                cur.execute(self._q("SELECT max(version) FROM {s}.schema"))
                row = cur.fetchone()
                version = (row[0] if row else None) or 0
                for i, steps in enumerate(MIGRATIONS[version:], start=version + 1):
                    for stmt in steps:
                        cur.execute(self._q(stmt))
                    cur.execute(self._q("INSERT INTO {s}.schema (version) VALUES (%s)"), (i,))
        except psycopg.Error as exc:
            raise StoreUnavailable(f"postgres migration failed: {exc}") from exc
        return len(MIGRATIONS)

    def read(self) -> Rows:
        cur = self._conn.cursor()
        cur.execute(self._q("SELECT seq, state FROM {s}.snapshot WHERE id = 1"))
        snap = cur.fetchone()
        cur.execute(self._q("SELECT seq, kind, payload FROM {s}.events ORDER BY seq"))
        events = [(int(a), str(b), str(c)) for a, b, c in cur.fetchall()]
        return Rows((int(snap[0]), str(snap[1])) if snap else None, events)

    def commit(self, batch: Batch) -> None:
        try:
            with self._conn.transaction():
                cur = self._conn.cursor()
                if batch.events:
                    with cur.copy(
                        self._q("COPY {s}.events (seq, kind, payload) FROM STDIN")
                    ) as copy:
                        for row in batch.events:
                            copy.write_row(row)
                if batch.tokens_added:
                    cur.executemany(
                        self._q(
                            "INSERT INTO {s}.tokens (sha256, session_id) VALUES (%s, %s)"
                            " ON CONFLICT (sha256) DO UPDATE SET session_id = EXCLUDED.session_id"
                        ),
                        batch.tokens_added,
                    )
                if batch.sessions_ended:
                    cur.execute(
                        self._q("DELETE FROM {s}.tokens WHERE session_id = ANY(%s)"),
                        (batch.sessions_ended,),
                    )
                if batch.snapshot is not None:
                    seq, state = batch.snapshot
                    cur.execute(
                        self._q(
                            "INSERT INTO {s}.snapshot (id, seq, state) VALUES (1, %s, %s)"
                            " ON CONFLICT (id) DO UPDATE"
                            " SET seq = EXCLUDED.seq, state = EXCLUDED.state"
                        ),
                        (seq, state),
                    )
                    cur.execute(self._q("DELETE FROM {s}.events WHERE seq <= %s"), (seq,))
        except psycopg.Error as exc:
            raise CommitFailed(f"postgres commit failed: {exc}") from exc

    def token_session(self, sha256: str) -> int | None:
        cur = self._conn.cursor()
        cur.execute(self._q("SELECT session_id FROM {s}.tokens WHERE sha256 = %s"), (sha256,))
        row = cur.fetchone()
        return int(row[0]) if row else None

    def raw_commit(self, n: int) -> None:
        cur = self._conn.cursor()
        cur.execute(self._q("CREATE TABLE IF NOT EXISTS {s}.raw_bench (i INTEGER, payload TEXT)"))
        for i in range(n):
            with self._conn.transaction():
                cur.execute(
                    self._q("INSERT INTO {s}.raw_bench (i, payload) VALUES (%s, %s)"),
                    (i, "x" * 100),
                )
        cur.execute(self._q("DROP TABLE {s}.raw_bench"))

    def drop_schema(self) -> None:
        """Tests only: remove everything this backend created."""
        self._conn.execute(self._q("DROP SCHEMA IF EXISTS {s} CASCADE"))

    def close(self) -> None:
        self._conn.close()

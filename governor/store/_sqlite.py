"""SQLite backend: the embedded default. WAL journal, synchronous FULL (every commit fsync'd)."""

from __future__ import annotations

import sqlite3

from ._backend import Batch, Rows
from ._errors import CommitFailed, StoreUnavailable

__all__ = ["SqliteBackend"]

MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE governor_events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL,"
        " payload TEXT NOT NULL)",
        "CREATE TABLE governor_snapshot (id INTEGER PRIMARY KEY CHECK (id = 1),"
        " seq INTEGER NOT NULL, state TEXT NOT NULL)",
        "CREATE TABLE governor_tokens (sha256 TEXT PRIMARY KEY, session_id INTEGER NOT NULL)",
        "CREATE INDEX governor_tokens_session ON governor_tokens (session_id)",
    ],
]


class SqliteBackend:
    name = "sqlite"

    def __init__(self, path: str, *, busy_timeout_ms: int = 5_000) -> None:
        try:
            self._conn = sqlite3.connect(
                path,
                isolation_level=None,
                check_same_thread=False,
                timeout=busy_timeout_ms / 1000,
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite {path}: {exc}") from exc
        self.path = path

    def migrate(self) -> int:
        c = self._conn
        try:
            c.execute("BEGIN IMMEDIATE")
            c.execute("CREATE TABLE IF NOT EXISTS governor_schema (version INTEGER NOT NULL)")
            row = c.execute("SELECT max(version) FROM governor_schema").fetchone()
            version = row[0] or 0
            for i, steps in enumerate(MIGRATIONS[version:], start=version + 1):
                for stmt in steps:
                    c.execute(stmt)
                c.execute("INSERT INTO governor_schema (version) VALUES (?)", (i,))
            c.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise StoreUnavailable(f"sqlite migration failed: {exc}") from exc
        return len(MIGRATIONS)

    def read(self) -> Rows:
        c = self._conn
        snap = c.execute("SELECT seq, state FROM governor_snapshot WHERE id = 1").fetchone()
        events = c.execute("SELECT seq, kind, payload FROM governor_events ORDER BY seq").fetchall()
        return Rows(tuple(snap) if snap else None, [tuple(r) for r in events])

    def commit(self, batch: Batch) -> None:
        c = self._conn
        try:
            c.execute("BEGIN IMMEDIATE")
            c.executemany(
                "INSERT INTO governor_events (seq, kind, payload) VALUES (?, ?, ?)",
                batch.events,
            )
            if batch.tokens_added:
                c.executemany(
                    "INSERT OR REPLACE INTO governor_tokens (sha256, session_id) VALUES (?, ?)",
                    batch.tokens_added,
                )
            if batch.sessions_ended:
                c.executemany(
                    "DELETE FROM governor_tokens WHERE session_id = ?",
                    [(s,) for s in batch.sessions_ended],
                )
            if batch.snapshot is not None:
                seq, state = batch.snapshot
                c.execute(
                    "INSERT OR REPLACE INTO governor_snapshot (id, seq, state) VALUES (1, ?, ?)",
                    (seq, state),
                )
                c.execute("DELETE FROM governor_events WHERE seq <= ?", (seq,))
            c.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise CommitFailed(f"sqlite commit failed: {exc}") from exc

    def token_session(self, sha256: str) -> int | None:
        row = self._conn.execute(
            "SELECT session_id FROM governor_tokens WHERE sha256 = ?", (sha256,)
        ).fetchone()
        return int(row[0]) if row else None

    def _rollback(self) -> None:
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def close(self) -> None:
        self._conn.close()

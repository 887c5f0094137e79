"""The spend quotas' cell tier on PostgreSQL (`shared_state.postgres`; docs/postgres.md).

The same cells as the Redis tier (`_cells.py`), as rows of one table: (key, member) -> burn
and a beat from the database server's clock, so workers need not agree on time. One
transaction does the whole flush, serialised per key by a transaction-scoped advisory lock:
set this worker's row to max(old, new) (a new row only while the key has fewer than
`cells_max`), drop rows whose beat is older than the retention, return every row left. A
row with no beat (written by something else) is kept, never aged, as in Redis. The key is
the same hash of the scope and period (`cell_key`), so tenant ids stay out of the database;
a row past its `expires_at` (its period could have ended a retention ago) is swept, a
bounded batch per flush, as Redis expires a hash by its TTL.

psycopg errors are translated here, at the adapter: an unreachable or timed-out server is
`PeerUnavailable`, any other failure `PeerRefused`, both naming `shared_state.postgres` and
chained `from` the driver's error; the DSN (which may carry a password) is never printed.
The connection opens at the first call (constructing the tier dials nothing) and is
dropped after a failure, so the next call dials again.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg import sql

from mesh.config import PostgresConfig
from mesh.core.policy import RateKey
from mesh.core.quota import CELL_RETENTION_MS, CELLS_PER_KEY_MAX
from mesh.errors import PeerError, PeerRefused, PeerUnavailable
from mesh.sharedstate._cells import CELL_KEY_PREFIX, TTL_MS, cell_key

__all__ = ["CONNECT_TIMEOUT_S", "SWEEP_ROWS_MAX", "PostgresCellTier"]

# libpq's shortest connect timeout (it rounds anything lower up to 2 s).
CONNECT_TIMEOUT_S = 2
# Expired rows deleted per flush: the sweep is a bounded step, never a table scan.
SWEEP_ROWS_MAX = 256
FIELD = "shared_state.postgres"

_DDL = (
    "CREATE SCHEMA IF NOT EXISTS {s}",
    "CREATE TABLE IF NOT EXISTS {s}.quota_cells ("
    " key TEXT NOT NULL, member TEXT NOT NULL, burn NUMERIC(20, 0) NOT NULL,"
    " beat TIMESTAMPTZ, expires_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (key, member))",
    "CREATE INDEX IF NOT EXISTS quota_cells_expires ON {s}.quota_cells (expires_at)",
    "CREATE INDEX IF NOT EXISTS quota_cells_member ON {s}.quota_cells (member)",
)
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))"
_WRITE = (
    "INSERT INTO {s}.quota_cells AS c (key, member, burn, beat, expires_at)"
    " SELECT %(key)s, %(member)s, %(burn)s, now(), now() + %(ttl_ms)s * interval '1 ms'"
    " WHERE EXISTS (SELECT 1 FROM {s}.quota_cells WHERE key = %(key)s AND member = %(member)s)"
    " OR (SELECT count(*) FROM {s}.quota_cells WHERE key = %(key)s) < %(cells_max)s"
    " ON CONFLICT (key, member) DO UPDATE SET burn = greatest(c.burn, excluded.burn),"
    " beat = excluded.beat, expires_at = excluded.expires_at"
)
_AGE_OUT = (
    "DELETE FROM {s}.quota_cells WHERE key = %(key)s"
    " AND beat < now() - %(retention_ms)s * interval '1 ms'"
)
_READ = "SELECT member, burn FROM {s}.quota_cells WHERE key = %(key)s ORDER BY member"
_SWEEP = (
    "DELETE FROM {s}.quota_cells WHERE ctid IN (SELECT ctid FROM {s}.quota_cells"
    " WHERE expires_at < now() LIMIT %(sweep)s)"
)
_FORGET = "DELETE FROM {s}.quota_cells WHERE member = %(member)s"


class PostgresCellTier:
    """`CellTier` on PostgreSQL: one transaction per (key, period) flush. Thread-safe (the
    node calls it from executor threads): one connection, one call at a time."""

    def __init__(
        self,
        config: PostgresConfig,
        *,
        deadline_ms: int,
        retention_ms: int = CELL_RETENTION_MS,
        cells_max: int = CELLS_PER_KEY_MAX,
        prefix: str = CELL_KEY_PREFIX,
    ) -> None:
        self.config = config
        self.deadline_ms = deadline_ms
        self.retention_ms = retention_ms
        self.cells_max = cells_max
        self.prefix = prefix
        self._s = sql.Identifier(config.schema)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.RLock()  # close() takes it too, also from inside a call
        self.connects = 0  # connections opened (the first call, and after each failure)

    def _q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=self._s)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(
                self.config.dsn,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name="ratemesh-cells",
                options=f"-c statement_timeout={self.deadline_ms}",
            )
            try:
                with conn.transaction():
                    for stmt in _DDL:
                        conn.execute(self._q(stmt))
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self.connects += 1
        return self._conn

    def _call(self, what: str, work: Any) -> Any:
        """Run `work(conn)` in one transaction; psycopg's errors become PeerErrors."""
        with self._lock:
            try:
                conn = self._connection()
                with conn.transaction():
                    return work(conn)
            except psycopg.Error as exc:
                self.close()  # the next call dials again
                raise _translate(exc, what) from exc

    def exchange(
        self, now_ms: int, key: RateKey, period_index: int, member: str, burn: int
    ) -> dict[str, int]:
        """Write `member`'s cell as max(old, burn) and return every live cell. `now_ms` is
        unused: the server's clock beats. Raises PeerError when PostgreSQL fails."""
        if burn < 0:
            raise ValueError(f"burn must be >= 0, got {burn}")
        args = {
            "key": cell_key(key, period_index, self.prefix),
            "member": member,
            "burn": burn,
            "ttl_ms": TTL_MS,
            "cells_max": self.cells_max,
            "retention_ms": self.retention_ms,
            "sweep": SWEEP_ROWS_MAX,
        }

        def work(conn: psycopg.Connection[Any]) -> dict[str, int]:
            conn.execute(_LOCK, args)
            conn.execute(self._q(_WRITE), args)
            conn.execute(self._q(_AGE_OUT), args)
            conn.execute(self._q(_SWEEP), args)
            rows = conn.execute(self._q(_READ), args).fetchall()
            return {str(m): int(b) for m, b in rows}

        out: dict[str, int] = self._call("exchange", work)
        return out

    def forget_member(self, member: str) -> int:
        """Purge a decommissioned member's cells by name; the rows deleted."""

        def work(conn: psycopg.Connection[Any]) -> int:
            return conn.execute(self._q(_FORGET), {"member": member}).rowcount

        dropped: int = self._call("forget_member", work)
        return dropped

    def close(self) -> None:
        """Drop the connection (after a call in flight ends); the next call dials again."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _translate(exc: psycopg.Error, what: str) -> PeerError:
    """Not the DSN (it may carry a password): psycopg's message names host and port."""
    text = " ".join(str(exc).split())[:200]
    if isinstance(exc, psycopg.OperationalError):  # unreachable, timed out, shut down
        return PeerUnavailable(FIELD, f"{what}: {text}")
    return PeerRefused(FIELD, f"{what}: {text}")

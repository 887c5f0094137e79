"""PostgreSQL backend (psycopg 3): for a governord that serves several machines, with standbys.

All tables live in one schema (default ``governor``), so tests and several deployments can share
a database. Commits use the server's default ``synchronous_commit = on``.

Leadership (docs/failover.md) is the ``leader`` row: an epoch, the holder, the address clients
are sent to, the holder's backend pid and when it last renewed, by the database's clock. Every
commit first renews the row *for its own epoch* inside its transaction, so a deposed leader's
commit changes nothing and fails (``Deposed``). A standby takes the row (epoch + 1) when its
holder's backend is gone (a killed process's connection closes at once) or its renewal is older
than its lease; it terminates the old holder's backend first, so a commit that hangs in a
partition rolls back instead of blocking the takeover.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ._backend import Batch, LeaderRow, Rows
from ._errors import CommitFailed, Deposed, StoreUnavailable

__all__ = ["PostgresBackend"]

TAKEOVER_LOCK_TIMEOUT_MS = 2000  # a takeover waits this long for the leader row, then retries

MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE {s}.events (seq BIGINT PRIMARY KEY, kind TEXT NOT NULL,"
        " payload TEXT NOT NULL)",
        "CREATE TABLE {s}.snapshot (id INTEGER PRIMARY KEY CHECK (id = 1),"
        " seq BIGINT NOT NULL, state TEXT NOT NULL)",
        "CREATE TABLE {s}.tokens (sha256 TEXT PRIMARY KEY, session_id BIGINT NOT NULL)",
        "CREATE INDEX ON {s}.tokens (session_id)",
    ],
    [
        "CREATE TABLE {s}.leader (id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL,"
        " holder TEXT NOT NULL, address TEXT NOT NULL, pid INTEGER NOT NULL,"
        " lease_ms INTEGER NOT NULL, renewed_at TIMESTAMPTZ NOT NULL)",
    ],
]

_LEADER_ROW = (
    "SELECT epoch, holder, address, pid, lease_ms,"
    " (extract(epoch FROM now() - renewed_at) * 1000)::bigint,"
    " EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid)"
    " FROM {s}.leader l WHERE id = 1"
)
# The row may be taken when its holder's backend is gone or its lease has run out.
_TAKEABLE = (
    "(NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid)"
    " OR now() - renewed_at > make_interval(secs => lease_ms / 1000.0))"
)


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
        self.epoch: int | None = None  # set once this process leads: every commit checks it
        # Both True but in a planted-bug test (governor/server/_plant.py, skip_epoch_check).
        self.check_epoch = True
        self.end_old_holder = True

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
                if self.epoch is not None:
                    self._fence(cur, self.epoch)
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

    def _fence(self, cur: psycopg.Cursor[Any], epoch: int) -> None:
        """Renew the leader row for ``epoch``, inside the commit's transaction, or refuse."""
        cur.execute(
            self._q("UPDATE {s}.leader SET renewed_at = now() WHERE id = 1 AND epoch = %s"),
            (epoch,),
        )
        if cur.rowcount != 1 and self.check_epoch:
            cur.execute(self._q("SELECT epoch, address FROM {s}.leader WHERE id = 1"))
            row = cur.fetchone()
            who = f"epoch {row[0]} at {row[1]}" if row else "nobody"
            raise Deposed(f"this governord (epoch {epoch}) was deposed; the leader is {who}")

    # ---- leadership ------------------------------------------------------------------------

    def leader(self) -> LeaderRow | None:
        """The leader row as the database sees it now (None: nobody ever led)."""
        try:
            cur = self._conn.cursor()
            cur.execute(self._q(_LEADER_ROW))
            row = cur.fetchone()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"postgres: cannot read the leader row: {exc}") from exc
        if row is None:
            return None
        epoch, holder, address, pid, lease_ms, age_ms, alive = row
        return LeaderRow(
            int(epoch), str(holder), str(address), int(pid), int(lease_ms), int(age_ms), bool(alive)
        )

    def try_lead(self, holder: str, address: str, lease_ms: int) -> int | None:
        """Take the leader row if nobody holds it, or its holder is gone or out of lease:
        the new epoch, or None (someone else leads). The holder's backend is terminated first,
        so a commit of the old leader that hangs (a partition) rolls back instead of waiting."""
        try:
            cur = self._conn.cursor()
            cur.execute(self._q("SELECT l.epoch, l.pid, " + _TAKEABLE + " FROM {s}.leader l"))
            seen = cur.fetchone()
            if seen is None:  # nobody ever led (a plain read: a held row lock cannot stall it)
                with self._conn.transaction():
                    cur.execute(
                        self._q(
                            "INSERT INTO {s}.leader (id, epoch, holder, address, pid, lease_ms,"
                            " renewed_at) VALUES (1, 1, %s, %s, pg_backend_pid(), %s, now())"
                            " ON CONFLICT (id) DO NOTHING RETURNING epoch"
                        ),
                        (holder, address, lease_ms),
                    )
                    row = cur.fetchone()
                if row is None:
                    return None  # another process inserted it first
                self.epoch = int(row[0])
                return self.epoch
            if not seen[2]:
                return None
            old_epoch, old_pid = int(seen[0]), int(seen[1])
            self._terminate(old_pid)
            with self._conn.transaction():
                cur = self._conn.cursor()
                cur.execute(f"SET LOCAL lock_timeout = {TAKEOVER_LOCK_TIMEOUT_MS}")
                cur.execute(
                    self._q(
                        "UPDATE {s}.leader l SET epoch = epoch + 1, holder = %s, address = %s,"
                        " pid = pg_backend_pid(), lease_ms = %s, renewed_at = now()"
                        " WHERE id = 1 AND epoch = %s AND " + _TAKEABLE + " RETURNING epoch"
                    ),
                    (holder, address, lease_ms, old_epoch),
                )
                row = cur.fetchone()
        except psycopg.errors.LockNotAvailable:
            return None  # the old holder's transaction still holds the row: try again later
        except psycopg.Error as exc:
            raise StoreUnavailable(f"postgres: taking the leader row failed: {exc}") from exc
        if row is None:
            return None
        self.epoch = int(row[0])
        return self.epoch

    def _terminate(self, pid: int) -> None:
        """End the old holder's backend, if it is still there (and ours to end)."""
        if pid == self._conn.info.backend_pid or not self.end_old_holder:
            return
        try:
            self._conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        except psycopg.Error:
            pass  # not allowed (another role): the takeover waits out the row lock instead

    def step_down(self) -> None:
        """A clean stop: give the row up (its lease ends now), so a standby takes over at once."""
        if self.epoch is None:
            return
        try:
            self._conn.execute(
                self._q("UPDATE {s}.leader SET renewed_at = 'epoch' WHERE id = 1 AND epoch = %s"),
                (self.epoch,),
            )
        except psycopg.Error:
            pass  # the database is gone: the lease runs out by itself
        self.epoch = None

    def read_after(self, snapshot_seq: int, after: int) -> Rows | None:
        """Events after ``after`` if the snapshot row is still the one at ``snapshot_seq``
        (a standby tailing the log); None if a newer snapshot replaced it (read it all again)."""
        cur = self._conn.cursor()
        cur.execute(self._q("SELECT seq FROM {s}.snapshot WHERE id = 1"))
        snap = cur.fetchone()
        if (int(snap[0]) if snap else 0) != snapshot_seq:
            return None
        cur.execute(
            self._q("SELECT seq, kind, payload FROM {s}.events WHERE seq > %s ORDER BY seq"),
            (after,),
        )
        events = [(int(a), str(b), str(c)) for a, b, c in cur.fetchall()]
        return Rows(None, events)

    def token_session(self, sha256: str) -> int | None:
        cur = self._conn.cursor()
        cur.execute(self._q("SELECT session_id FROM {s}.tokens WHERE sha256 = %s"), (sha256,))
        row = cur.fetchone()
        return int(row[0]) if row else None

    def drop_schema(self) -> None:
        """Tests only: remove everything this backend created."""
        self._conn.execute(self._q("DROP SCHEMA IF EXISTS {s} CASCADE"))

    def close(self) -> None:
        self.step_down()
        self._conn.close()

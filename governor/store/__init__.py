"""governord's durable record: an append-only event log, a snapshot row, token hashes.

SQLite (embedded default: WAL, synchronous FULL) and PostgreSQL (psycopg 3) sit behind one
``Backend`` protocol; ``EventLog`` adds group commit and the checks that refuse a bad record.
"""

from ratemesh.errors import ConfigError

from ._backend import Backend, Batch, LeaderRow, Leadership, Rows
from ._errors import CommitFailed, Deposed, StoreError, StoreUnavailable
from ._log import EXIT_COMMIT_FAILED, EventLog, Loaded, exit_process
from ._memory import MemoryBackend
from ._postgres import PostgresBackend
from ._sqlite import SqliteBackend

__all__ = [
    "EXIT_COMMIT_FAILED",
    "Backend",
    "Batch",
    "CommitFailed",
    "Deposed",
    "EventLog",
    "LeaderRow",
    "Leadership",
    "Loaded",
    "MemoryBackend",
    "PostgresBackend",
    "Rows",
    "SqliteBackend",
    "StoreError",
    "StoreUnavailable",
    "exit_process",
    "open_backend",
]


def open_backend(kind: str, target: str, *, schema: str = "governor") -> Backend:
    """``kind`` is ``sqlite`` (target: a file path) or ``postgres`` (target: a DSN)."""
    if kind == "sqlite":
        return SqliteBackend(target)
    if kind == "postgres":
        return PostgresBackend(target, schema=schema)
    # The kind comes from the operator's `store:` setting, so the mistake is theirs to fix.
    raise ConfigError("store", f"kind must be 'sqlite' or 'postgres', got {kind!r}")

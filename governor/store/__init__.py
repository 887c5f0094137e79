"""governord's durable record: an append-only event log, a snapshot row, token hashes.

SQLite (embedded default: WAL, synchronous FULL) and PostgreSQL (psycopg 3) sit behind one
``Backend`` protocol; ``EventLog`` adds group commit and the checks that refuse a bad record.
``SCHEMES`` is the one table of what a ``store:`` setting may name (with the memory store).
"""

from ._backend import Backend, Batch, LeaderRow, Leadership, Rows
from ._errors import CommitFailed, Deposed, StoreError, StoreUnavailable
from ._log import EXIT_COMMIT_FAILED, EventLog, Loaded, exit_process
from ._memory import MemoryBackend
from ._postgres import PostgresBackend
from ._schemes import SCHEMES, STORE_FORMS, StoreScheme, open_backend, parse_store
from ._sqlite import SqliteBackend

__all__ = [
    "EXIT_COMMIT_FAILED",
    "SCHEMES",
    "STORE_FORMS",
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
    "StoreScheme",
    "StoreUnavailable",
    "exit_process",
    "open_backend",
    "parse_store",
]

"""Errors of the durable store, joined to the engine's tree (see ``governor.engine._errors``)::

GovernorError
├── RecordError (from the engine: LogGap, UnknownEventKind, SnapshotMismatch)
└── StoreError                 the database failed; sqlite3 / psycopg errors are chained
    ├── StoreUnavailable       could not open, connect to or migrate the database
    └── CommitFailed           a commit failed: the process must stop (never roll back memory)
        └── Deposed            another governord took the leader row: this one stops serving
"""

from __future__ import annotations

from governor.engine import GovernorError

__all__ = ["CommitFailed", "Deposed", "StoreError", "StoreUnavailable"]


class StoreError(GovernorError):
    """The database failed."""


class StoreUnavailable(StoreError):
    """Could not open, connect to or migrate the database."""


class CommitFailed(StoreError):
    """A commit failed. Memory is ahead of the record, so the process stops and restarts."""


class Deposed(CommitFailed):
    """The leader row's epoch is no longer this process's: a standby took over."""

"""Errors of the governor engine and its record.

A denial (a cap is full, a node has ended) is a value returned by the engine, never an
exception. Exceptions are kept for the caller's mistakes, for calls the caller may not make,
and for a record that cannot be trusted::

    GovernorError
    ├── CallerError (ValueError)         the arguments are wrong; names the field; changes nothing
    │   ├── InvalidArgument              a value of the wrong type or range
    │   ├── RequestIdReused              the same request id with different arguments
    │   ├── GenerationConflict           a mesh policy's generation would change meaning
    │   └── NotFound (LookupError)       no such node / session / lease (or its tombstone is gone)
    ├── AccessError (PermissionError)    the call is well formed but not allowed; changes nothing
    │   ├── OutOfScope                   the target lies outside the session's subtree
    │   ├── NotOwner                     the lease belongs to another session
    │   └── SessionEnded                 the session was closed or has expired
    └── RecordError                      the durable record cannot be loaded as it is
        ├── LogGap                       a sequence number is missing or out of order
        ├── UnknownEventKind             an event kind this version does not know
        └── SnapshotMismatch             the snapshot does not fit the events or this version

The store adds ``StoreError`` (see ``governor.store``) for database failures.
"""

from __future__ import annotations

__all__ = [
    "AccessError",
    "CallerError",
    "GenerationConflict",
    "GovernorError",
    "InvalidArgument",
    "LogGap",
    "NotFound",
    "NotOwner",
    "OutOfScope",
    "RecordError",
    "RequestIdReused",
    "SessionEnded",
    "SnapshotMismatch",
    "UnknownEventKind",
]


class GovernorError(Exception):
    """Root of every error governord raises on purpose."""


class CallerError(GovernorError, ValueError):
    """The caller's mistake. ``field`` names the argument at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidArgument(CallerError):
    """A value of the wrong type or out of range."""


class RequestIdReused(CallerError):
    """A request id already used by this session with different arguments."""


class GenerationConflict(CallerError):
    """A mesh policy put that would give a generation a second meaning, go backwards, or was
    computed against a generation that is no longer the key's last (another writer's)."""


class NotFound(CallerError, LookupError):
    """No node, session or lease with that id (or its tombstone has been purged)."""


class AccessError(GovernorError, PermissionError):
    """A well-formed call that this session may not make."""


class OutOfScope(AccessError):
    """The target node lies outside the session's subtree, or is its scope node (for edits)."""


class NotOwner(AccessError):
    """The lease belongs to another session."""


class SessionEnded(AccessError):
    """The session was closed or has expired; open a new one."""


class RecordError(GovernorError):
    """The durable record cannot be loaded as it is; refuse to start rather than guess."""


class LogGap(RecordError):
    """A sequence number is missing, repeated or out of order."""


class UnknownEventKind(RecordError):
    """An event kind this version does not know."""


class SnapshotMismatch(RecordError):
    """The snapshot does not fit the events after it, or has an unknown format."""

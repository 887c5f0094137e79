"""What a database must offer the group-commit log: one ordered log, one snapshot row, token hashes.

Both backends hold one connection, used by one thread at a time (the loader, then the writer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Backend", "Batch", "LeaderRow", "Leadership", "Rows"]


@dataclass(frozen=True, slots=True)
class Batch:
    """Everything one transaction writes: events in order, token changes, maybe a snapshot."""

    events: list[tuple[int, str, str]]  # (seq, kind, payload json)
    tokens_added: list[tuple[str, int]]  # (sha256 hex, session id)
    sessions_ended: list[int]  # their token rows are deleted
    snapshot: tuple[int, str] | None  # (seq, state json): stored, and events <= seq deleted


@dataclass(frozen=True, slots=True)
class Rows:
    snapshot: tuple[int, str] | None
    events: list[tuple[int, str, str]]


@dataclass(frozen=True, slots=True)
class LeaderRow:
    """Who leads, as the database sees it (``renewed_age_ms`` by the database's own clock)."""

    epoch: int
    holder: str
    address: str
    pid: int  # the holder's backend: gone when the holder's process is
    lease_ms: int
    renewed_age_ms: int
    alive: bool  # the holder's backend is still connected

    @property
    def takeable(self) -> bool:
        return not self.alive or self.renewed_age_ms > self.lease_ms


class Backend(Protocol):
    name: str

    def migrate(self) -> int:
        """Bring the schema up to date; returns the schema version."""
        ...

    def read(self) -> Rows:
        """The snapshot row (if any) and every event row, in sequence order."""
        ...

    def commit(self, batch: Batch) -> None:
        """Write the batch as one durable transaction, or raise (and write nothing)."""
        ...

    def token_session(self, sha256: str) -> int | None: ...

    def close(self) -> None: ...


class Leadership(Backend, Protocol):
    """A backend several governords share (PostgreSQL): one leads, fenced by an epoch."""

    epoch: int | None

    def leader(self) -> LeaderRow | None: ...

    def try_lead(self, holder: str, address: str, lease_ms: int) -> int | None: ...

    def step_down(self) -> None: ...

    def read_after(self, snapshot_seq: int, after: int) -> Rows | None: ...

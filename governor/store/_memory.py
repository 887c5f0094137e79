"""A backend that keeps the record in this process's memory: not durable, for benchmarks
(the "in memory" overhead figure) and tests. A restart starts from an empty record."""

from __future__ import annotations

from ._backend import Batch, Rows

__all__ = ["MemoryBackend"]


class MemoryBackend:
    name = "memory"

    def __init__(self) -> None:
        self._events: list[tuple[int, str, str]] = []
        self._snapshot: tuple[int, str] | None = None

    def migrate(self) -> int:
        return 1

    def read(self) -> Rows:
        return Rows(self._snapshot, list(self._events))

    def commit(self, batch: Batch) -> None:
        self._events.extend(batch.events)
        if batch.snapshot is not None:
            self._snapshot = batch.snapshot
            seq = batch.snapshot[0]
            self._events = [e for e in self._events if e[0] > seq]

    def token_session(self, sha256: str) -> int | None:
        return None

    def close(self) -> None:
        return None

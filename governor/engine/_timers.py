"""Due-time heaps for the engine: session expiry, deadlines and purges of old records.

Entries may be stale (a heartbeat moved an expiry, a deadline was edited); the engine checks the
current value when an entry comes due, so correctness never depends on the heap being exact.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

__all__ = ["PURGE_BLOCK", "PURGE_LEASE", "PURGE_NODE", "PURGE_SESSION", "Timers"]

PURGE_LEASE = 0
PURGE_SESSION = 1
PURGE_NODE = 2
PURGE_BLOCK = 3  # a credit block at its expiry (see _creditbook.CreditBook.expire)


@dataclass(slots=True)
class Timers:
    expiry: list[tuple[int, int]] = field(default_factory=list)  # (expires_ms, session_id)
    deadline: list[tuple[int, int, int]] = field(default_factory=list)  # (ms, depth, node_id)
    purge: list[tuple[int, int, int, int]] = field(default_factory=list)  # (ms, -depth, kind, id)

    def add_expiry(self, at_ms: int, session_id: int) -> None:
        heapq.heappush(self.expiry, (at_ms, session_id))

    def add_deadline(self, at_ms: int, depth: int, node_id: int) -> None:
        heapq.heappush(self.deadline, (at_ms, depth, node_id))

    def add_purge(self, at_ms: int, depth: int, kind: int, ident: int) -> None:
        heapq.heappush(self.purge, (at_ms, -depth, kind, ident))

    def due_expiry(self, now_ms: int) -> list[int]:
        out = []
        while self.expiry and self.expiry[0][0] <= now_ms:
            out.append(heapq.heappop(self.expiry)[1])
        return sorted(set(out))

    def due_deadline(self, now_ms: int) -> list[tuple[int, int, int]]:
        out = []
        while self.deadline and self.deadline[0][0] <= now_ms:
            out.append(heapq.heappop(self.deadline))
        return out

    def due_purge(self, now_ms: int) -> list[tuple[int, int, int, int]]:
        out = []
        while self.purge and self.purge[0][0] <= now_ms:
            out.append(heapq.heappop(self.purge))
        return out

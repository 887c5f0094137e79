"""Due-time heaps for the engine: session expiry, deadlines and purges of old records.

Entries may be stale (a heartbeat moved an expiry, a deadline was edited); the engine checks the
current value when an entry comes due, so correctness never depends on the heap being exact.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import _events as ev
from ._types import EngineConfig, NodeState, SessionState

if TYPE_CHECKING:
    from ._state import State

__all__ = [
    "PURGE_BLOCK",
    "PURGE_LEASE",
    "PURGE_NODE",
    "PURGE_SESSION",
    "SCHEDULED",
    "Timers",
    "rebuild_timers",
    "schedule",
]

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


# the events that create due times; the rest (charges, most edits) skip ``schedule``
SCHEDULED = frozenset(
    {
        ev.LeaseEnded,
        ev.SessionClosed,
        ev.SessionExpired,
        ev.NodeEnded,
        ev.SessionOpened,
        ev.NodeCreated,
        ev.DeadlineSet,
        ev.CreditGranted,
    }
)


def schedule(timers: Timers, event: ev.Event, state: State, config: EngineConfig) -> None:
    """Put the due times an applied event creates on the timers (live and after a restore)."""
    if isinstance(event, ev.LeaseEnded):
        timers.add_purge(event.at_ms + config.tombstone_ms, 0, PURGE_LEASE, event.lease_id)
    elif isinstance(event, (ev.SessionClosed, ev.SessionExpired)):
        timers.add_purge(event.at_ms + config.tombstone_ms, 0, PURGE_SESSION, event.session_id)
    elif isinstance(event, ev.NodeEnded):
        depth = state.nodes[event.node_id].depth
        timers.add_purge(event.at_ms + config.retention_ms, depth, PURGE_NODE, event.node_id)
    elif isinstance(event, ev.SessionOpened):
        timers.add_expiry(event.at_ms + event.ttl_ms, event.session_id)
    elif isinstance(event, (ev.NodeCreated, ev.DeadlineSet)):
        if event.deadline_ms is not None:
            node = state.nodes[event.node_id]
            timers.add_deadline(event.deadline_ms, node.depth, node.id)
    elif isinstance(event, ev.CreditGranted):
        timers.add_purge(event.expires_ms, 0, PURGE_BLOCK, event.block_id)


def rebuild_timers(timers: Timers, state: State, config: EngineConfig) -> None:
    """After a restore: every due time the state implies."""
    for session in state.sessions.values():
        if session.state is SessionState.OPEN:
            timers.add_expiry(session.expires_ms, session.id)
        elif session.ended_ms is not None:
            timers.add_purge(session.ended_ms + config.tombstone_ms, 0, PURGE_SESSION, session.id)
    for node in state.nodes.values():
        if node.state is NodeState.ACTIVE and node.deadline_ms is not None:
            timers.add_deadline(node.deadline_ms, node.depth, node.id)
        elif node.ended_ms is not None:
            timers.add_purge(node.ended_ms + config.retention_ms, node.depth, PURGE_NODE, node.id)
    for lease_id, tomb in state.tombstones.items():
        timers.add_purge(tomb.ended_ms + config.tombstone_ms, 0, PURGE_LEASE, lease_id)
    for block in state.credit.blocks.values():
        timers.add_purge(block.expires_ms, 0, PURGE_BLOCK, block.id)

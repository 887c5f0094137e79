"""Value types of the engine: states, the clock, configuration values and call results.

Results are values: a ``Denial`` is an answer, not an error. Everything here is frozen so it can
be stored in the idempotency memory and returned again unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "AdaptiveConfig",
    "BlockEnd",
    "Clock",
    "CreditGrant",
    "CreditReturn",
    "Consumed",
    "Created",
    "Defaults",
    "DenyReason",
    "Denial",
    "Edited",
    "EngineConfig",
    "Granted",
    "LeaseEnd",
    "LeaseStatus",
    "ManualClock",
    "Rate",
    "NODE_TRANSITIONS",
    "NodeState",
    "SESSION_TRANSITIONS",
    "Queued",
    "Released",
    "RequestTag",
    "SessionState",
]


class Clock(Protocol):
    """The only source of time the engine knows: integer milliseconds, never going back."""

    def now_ms(self) -> int: ...


class ManualClock:
    """A clock that moves only when told to: for tests, the simulator and replays."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, delta_ms: int) -> None:
        if delta_ms < 0:
            raise ValueError("delta_ms: a clock never goes back")
        self._now_ms += delta_ms


class NodeState(enum.Enum):
    ACTIVE = "active"
    DONE = "done"
    CANCELLED = "cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"

    @property
    def terminal(self) -> bool:
        return self is not NodeState.ACTIVE


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"
    EXPIRED = "expired"


# The only transitions there are, as data: terminal states are final.
NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.ACTIVE: frozenset({NodeState.DONE, NodeState.CANCELLED, NodeState.DEADLINE_EXCEEDED}),
    NodeState.DONE: frozenset(),
    NodeState.CANCELLED: frozenset(),
    NodeState.DEADLINE_EXCEEDED: frozenset(),
}
SESSION_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.OPEN: frozenset({SessionState.CLOSED, SessionState.EXPIRED}),
    SessionState.CLOSED: frozenset(),
    SessionState.EXPIRED: frozenset(),
}


class LeaseEnd(enum.Enum):
    """How a lease ended; kept in its tombstone so a late release learns it."""

    RELEASED = "released"
    SESSION_EXPIRED = "session_expired"
    SESSION_CLOSED = "session_closed"
    NODE_ENDED = "node_ended"


class DenyReason(enum.Enum):
    QUOTA = "quota"
    CONCURRENCY = "concurrency"
    NODE_ENDED = "node_ended"
    QUEUE_FULL = "queue_full"
    SESSION_ENDED = "session_ended"
    RATE = "rate"  # a rated node's bucket has no whole unit of credit left
    CREDIT_BLOCKS = "credit_blocks"  # a bound on outstanding credit blocks is reached
    NODES = "nodes"  # the tenant holds nodes_per_tenant_max nodes (EngineConfig)


@dataclass(frozen=True, slots=True)
class RequestTag:
    """A request id and the fingerprint of the arguments it was first used with."""

    request_id: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Defaults:
    """What new children of a node inherit; ``children`` is what *their* children inherit."""

    quotas: tuple[tuple[str, int], ...] = ()
    limits: tuple[tuple[str, int], ...] = ()
    weight: int | None = None
    priority: int | None = None
    children: Defaults | None = None


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """AIMD for one root class, once per ``interval_ms`` with ``min_samples`` releases: x0.7 on
    p95 over target; on overload share over max, x0.7 rounded up or down to the concurrency that
    was served if lower; else +1 (see ``HousekeepingMixin._adapt``)."""

    initial_limit: int
    min_limit: int
    max_limit: int
    target_p95_ms: int
    max_overload_permille: int = 100
    min_samples: int = 20
    interval_ms: int = 1000


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Bounds and periods; every map and queue in the engine has a named bound."""

    tombstone_ms: int = 60_000
    retention_ms: int = 600_000
    request_memory_max: int = 1024
    tenant_queue_max: int = 1024
    adaptive_samples_max: int = 4096
    waiter_outcomes_max: int = 65_536
    credit_ttl_ms: int = 10_000  # a credit block's life on governord's clock (<= session TTL)
    credit_blocks_per_session_max: int = 64
    credit_blocks_per_node_max: int = 4096  # outstanding blocks charged to one rated node
    credit_blocks_max: int = 65_536  # blocks kept in all (outstanding, or returned not expired)
    # Nodes one tenant (a child of the root) holds, itself and ended ones until they are purged
    # (retention_ms): a tenant cannot grow governord's tree, its snapshot or its replay without
    # bound. 10,000 holds thousands of live runs with their children, or 16 new nodes a second
    # kept for the default retention window.
    nodes_per_tenant_max: int = 10_000

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")


# ---- results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a call was refused. For a cap: the node whose cap was hit and its largest consumer."""

    reason: DenyReason
    node_id: int
    resource: str = ""
    used: int = 0
    limit: int = 0
    requested: int = 0
    top_consumer: int | None = None


@dataclass(frozen=True, slots=True)
class Consumed:
    node_id: int
    resource: str
    amount: int


@dataclass(frozen=True, slots=True)
class Granted:
    lease_id: int
    node_id: int
    cls: str


@dataclass(frozen=True, slots=True)
class Queued:
    waiter_id: int


@dataclass(frozen=True, slots=True)
class Released:
    """``by_this_call`` is False for a second release (a no-op) or a lease that ended otherwise."""

    lease_id: int
    end: LeaseEnd
    by_this_call: bool


@dataclass(frozen=True, slots=True)
class Created:
    node_id: int


@dataclass(frozen=True, slots=True)
class Edited:
    node_id: int


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    lease_id: int
    live: bool
    end: LeaseEnd | None


class BlockEnd(enum.Enum):
    """How a credit block stopped counting as outstanding."""

    RETURNED = "returned"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class CreditGrant:
    """A credit block: ``units`` to spend with no further call until the worker's local expiry
    (``ttl_ms`` timed from when it *sent* the request; governord counts it until
    ``expires_ms`` on its own clock)."""

    block_id: int
    node_id: int
    resource: str
    units: int
    ttl_ms: int
    expires_ms: int


@dataclass(frozen=True, slots=True)
class CreditReturn:
    """The answer to a return. ``applied`` is False for a second return (a no-op) or a block
    that expired first, whose units stay spent."""

    block_id: int
    unused: int
    applied: bool
    end: BlockEnd


@dataclass(frozen=True, slots=True)
class Rate:
    """R units per second, burst B units: the most any interval [t0, t1] admits is
    ``R * (t1 - t0) + B``."""

    per_s: int
    burst: int

"""The hot path a data-plane worker calls: try_admit / admit / charge / refund."""

from mesh.core.admission._admission import DEADLINE, QUEUE_FULL, STOPPED, UNKNOWN, Admission
from mesh.core.admission._breaker import BreakerState
from mesh.core.admission._counter import (
    Counter,
    CounterOutcome,
    CounterReply,
    MemoryCounter,
    gcra_step,
    parse_reply,
)
from mesh.core.admission._queue import TenantQueues, Waiter
from mesh.core.admission._redis import (
    REDIS_ASK,
    REDIS_DEADLINE_MS,
    Ask,
    Cause,
    RedisDesk,
    RedisGate,
    redis_key,
)
from mesh.core.admission._shadow import SHADOW_KEYS_MAX, WouldDeny, WouldDenyCount
from mesh.core.admission._strict import STRICT_BOUND, CreditDesk, StrictGate

__all__ = [
    "Admission",
    "Ask",
    "BreakerState",
    "Cause",
    "Counter",
    "CounterOutcome",
    "CounterReply",
    "MemoryCounter",
    "REDIS_ASK",
    "REDIS_DEADLINE_MS",
    "RedisDesk",
    "RedisGate",
    "gcra_step",
    "parse_reply",
    "redis_key",
    "CreditDesk",
    "DEADLINE",
    "QUEUE_FULL",
    "STOPPED",
    "STRICT_BOUND",
    "StrictGate",
    "TenantQueues",
    "UNKNOWN",
    "Waiter",
    "SHADOW_KEYS_MAX",
    "WouldDeny",
    "WouldDenyCount",
]

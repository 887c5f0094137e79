"""The hot path a data-plane worker calls: try_admit / admit / charge / refund."""

from mesh.core.admission._admission import DEADLINE, QUEUE_FULL, STOPPED, UNKNOWN, Admission
from mesh.core.admission._queue import TenantQueues, Waiter
from mesh.core.admission._strict import STRICT_BOUND, CreditDesk, StrictGate

__all__ = [
    "Admission",
    "CreditDesk",
    "DEADLINE",
    "QUEUE_FULL",
    "STOPPED",
    "STRICT_BOUND",
    "StrictGate",
    "TenantQueues",
    "UNKNOWN",
    "Waiter",
]

"""The hot path a data-plane worker calls: try_admit / admit / charge / refund."""

from mesh.core.admission._admission import DEADLINE, QUEUE_FULL, UNKNOWN, Admission
from mesh.core.admission._queue import TenantQueues, Waiter

__all__ = ["Admission", "DEADLINE", "QUEUE_FULL", "TenantQueues", "UNKNOWN", "Waiter"]

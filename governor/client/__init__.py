"""The Python SDK for governord: govern a tree of tasks with one import.

async with Client() as client:                      # GOVERNOR_ADDR, GOVERNOR_API_KEY, ...
    async with client.task("crawl", quotas={"http": 500, "retry": 20}):
        await consume("tokens", 10)                 # charged to the current task's chain
        async with acquire("db"):                   # one lease, released with its latency
            ...
"""

from ._client import Client, Group, Lease, Task, acquire, consume, current_task, validate
from ._credit import StrictCredit
from ._errors import (
    AcquireTimeout,
    AuthError,
    Denied,
    GovernorClientError,
    LeaderChanged,
    LeaseEnded,
    NodeEnded,
    RequestError,
    ScopeError,
    SessionLost,
    Unavailable,
)
from ._httpx import GovernedAsyncTransport, GovernedTransport
from ._retry import retry
from ._slot import Slot, cooldown, slot
from ._sync import SyncClient, SyncTask, current_sync_task

__all__ = [
    "AcquireTimeout",
    "AuthError",
    "Client",
    "Denied",
    "GovernedAsyncTransport",
    "GovernedTransport",
    "GovernorClientError",
    "Group",
    "LeaderChanged",
    "Lease",
    "LeaseEnded",
    "NodeEnded",
    "RequestError",
    "ScopeError",
    "SessionLost",
    "Slot",
    "StrictCredit",
    "SyncClient",
    "SyncTask",
    "Task",
    "Unavailable",
    "acquire",
    "consume",
    "cooldown",
    "current_sync_task",
    "current_task",
    "retry",
    "slot",
    "validate",
]

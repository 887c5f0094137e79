"""governord's engine: the strict tree of caps and leases, sans-I/O.

It takes a clock and an event sink; it never touches a socket, a database, a thread or the wall
clock. The driver (``governor.authority``) holds the one lock around each call and makes every
emitted event durable before the caller hears back.
"""

from ._codec import decode_value, encode_value
from ._core import EventSink
from ._engine import Engine
from ._errors import (
    AccessError,
    CallerError,
    GenerationConflict,
    GovernorError,
    InvalidArgument,
    LogGap,
    NotFound,
    NotOwner,
    OutOfScope,
    RecordError,
    RequestIdReused,
    SessionEnded,
    SnapshotMismatch,
    UnknownEventKind,
)
from ._events import EVENT_KINDS, Event, decode_event, encode_event
from ._fairq import Waiter
from ._policies import PolicyPutResult
from ._policybook import POLICY_HISTORY_MAX, POLICY_KEYS_MAX, PolicyBook, PolicyRecord
from ._snapshot import FORMAT as SNAPSHOT_FORMAT
from ._state import ROOT_ID, State
from ._types import (
    NODE_TRANSITIONS,
    SESSION_TRANSITIONS,
    AdaptiveConfig,
    BlockEnd,
    Clock,
    Consumed,
    Created,
    CreditGrant,
    CreditReturn,
    Defaults,
    Denial,
    DenyReason,
    Edited,
    EngineConfig,
    Granted,
    LeaseEnd,
    LeaseStatus,
    ManualClock,
    NodeState,
    Queued,
    Rate,
    Released,
    RequestTag,
    SessionState,
)

__all__ = [
    "EVENT_KINDS",
    "NODE_TRANSITIONS",
    "POLICY_HISTORY_MAX",
    "POLICY_KEYS_MAX",
    "SESSION_TRANSITIONS",
    "ROOT_ID",
    "SNAPSHOT_FORMAT",
    "AccessError",
    "AdaptiveConfig",
    "BlockEnd",
    "CallerError",
    "Clock",
    "Consumed",
    "Created",
    "CreditGrant",
    "CreditReturn",
    "Defaults",
    "Denial",
    "DenyReason",
    "Edited",
    "Engine",
    "EngineConfig",
    "Event",
    "EventSink",
    "GenerationConflict",
    "GovernorError",
    "Granted",
    "InvalidArgument",
    "LeaseEnd",
    "LeaseStatus",
    "LogGap",
    "ManualClock",
    "NodeState",
    "NotFound",
    "NotOwner",
    "OutOfScope",
    "PolicyBook",
    "PolicyPutResult",
    "PolicyRecord",
    "Queued",
    "Rate",
    "RecordError",
    "Released",
    "RequestIdReused",
    "RequestTag",
    "SessionEnded",
    "SessionState",
    "SnapshotMismatch",
    "State",
    "UnknownEventKind",
    "Waiter",
    "decode_event",
    "decode_value",
    "encode_event",
    "encode_value",
]

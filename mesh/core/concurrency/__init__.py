"""In-flight caps (concurrency limits): acquire a slot, release it (docs/policies.md).

Private modules, each importing only those above it:
    _timings    SlotTimings: the global mode's lease and member TTLs, the named bounds
    _formula    each mode's per-worker cap, the owner's grant, the disclosed bound
    _messages   SlotReport (worker -> owner) and SlotGrant (owner -> worker)
    _owner      SlotOwner: counts members' holdings per scope, grants, drops the silent
    _desk       SlotDesk: one worker's slots and leases in every mode, its reports
"""

from mesh.core.concurrency._desk import SENT_KEPT, SlotDesk, SlotReason, SlotVerdict
from mesh.core.concurrency._formula import (
    CONCURRENCY_BOUNDS,
    global_excess,
    grant_size,
    slot_cap,
)
from mesh.core.concurrency._messages import Scope, SlotGrant, SlotReport, ring_key
from mesh.core.concurrency._owner import GRANTS_KEPT, SlotOwner
from mesh.core.concurrency._timings import SlotTimings, usable_ms

__all__ = [
    "CONCURRENCY_BOUNDS",
    "GRANTS_KEPT",
    "SENT_KEPT",
    "Scope",
    "SlotDesk",
    "SlotGrant",
    "SlotOwner",
    "SlotReason",
    "SlotReport",
    "SlotTimings",
    "SlotVerdict",
    "global_excess",
    "grant_size",
    "ring_key",
    "slot_cap",
    "usable_ms",
]

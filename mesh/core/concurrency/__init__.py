"""In-flight caps (concurrency limits): acquire a slot, release it (docs/policies.md).

Private modules, each importing only those above it:
    _timings    SlotTimings: the global mode's lease and member TTLs, the named bounds
    _formula    each mode's per-worker cap, the owner's grant, the disclosed bound
    _messages   SlotReport(s) (worker -> owner) and SlotGrant(s) (owner -> worker), from
                the messages family (mesh.core.messages._slots, their wire form too)
    _owner      SlotOwner: counts members' holdings per scope, grants, drops the silent
    _desk       SlotDesk: one worker's slots and leases in every mode, its reports
    _exchange   SlotExchange: a member's desk and owner, driven by its tick and peers
"""

from mesh.core.concurrency._desk import SENT_KEPT, SlotDesk, SlotReason, SlotVerdict
from mesh.core.concurrency._exchange import SlotExchange
from mesh.core.concurrency._formula import (
    CONCURRENCY_BOUNDS,
    global_excess,
    grant_size,
    slot_cap,
)
from mesh.core.concurrency._messages import (
    SLOT_ROWS_MAX,
    Scope,
    SlotGrant,
    SlotGrants,
    SlotReport,
    SlotReports,
    ring_key,
)
from mesh.core.concurrency._owner import GRANTS_KEPT, SlotOwner
from mesh.core.concurrency._timings import SlotTimings, usable_ms

__all__ = [
    "CONCURRENCY_BOUNDS",
    "GRANTS_KEPT",
    "SENT_KEPT",
    "SLOT_ROWS_MAX",
    "Scope",
    "SlotDesk",
    "SlotExchange",
    "SlotGrant",
    "SlotGrants",
    "SlotOwner",
    "SlotReason",
    "SlotReport",
    "SlotReports",
    "SlotTimings",
    "SlotVerdict",
    "global_excess",
    "grant_size",
    "ring_key",
    "slot_cap",
    "usable_ms",
]

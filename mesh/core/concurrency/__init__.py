"""In-flight caps (concurrency limits): acquire a slot, release it (docs/policies.md).

The messages a worker and an owner exchange (SlotReport(s), SlotGrant(s)) live in the
messages family beside their wire form (`mesh.core.messages._slots`) and are re-exported
here.

Private modules, each importing only those above it:
    _timings    SlotTimings: the global mode's lease and member TTLs, the named bounds
    _formula    each mode's per-worker cap, the owner's grant, the disclosed bound
    _owner      SlotOwner: counts members' holdings per scope, grants, drops the silent
    _desk       SlotDesk: one worker's slots and leases in every mode, its reports
    _exchange   SlotExchange: a member's desk and owner, driven by its tick and peers
"""

from mesh.core.concurrency._desk import SENT_KEPT, SlotDesk, SlotReason, SlotVerdict
from mesh.core.concurrency._exchange import SlotExchange
from mesh.core.concurrency._formula import (
    CONCURRENCY_BOUNDS,
    SHARE_STALE_BOUND,
    global_excess,
    grant_size,
    slot_cap,
)
from mesh.core.concurrency._owner import GRANTS_KEPT, SlotOwner
from mesh.core.concurrency._timings import SlotTimings, usable_ms
from mesh.core.messages._slots import (
    SLOT_ROWS_MAX,
    Scope,
    SlotGrant,
    SlotGrants,
    SlotReport,
    SlotReports,
    ring_key,
)

__all__ = [
    "CONCURRENCY_BOUNDS",
    "GRANTS_KEPT",
    "SENT_KEPT",
    "SHARE_STALE_BOUND",
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

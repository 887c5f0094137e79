"""The slot messages, from the messages family (`mesh.core.messages._slots`), by the
names this package uses."""

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
    "SLOT_ROWS_MAX",
    "Scope",
    "SlotGrant",
    "SlotGrants",
    "SlotReport",
    "SlotReports",
    "ring_key",
]

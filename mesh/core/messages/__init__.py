"""The mesh's peer messages, and their one wire codec (msgpack).

Workers send `ReportBatch`es of `UsageReport`s to each key's owner; owners answer with
`SnapshotBatch`es of `RateSnapshot`s (and `Rejection`s for reports they will not take); a
leaving owner sends a `Handover`. Every message is a frozen, slotted dataclass; `encode` and
`decode` are the only way one crosses the wire (docs/mesh-wire.md).

Private modules, each importing only those above it in this list:
    _keys       rate keys on the wire and their checks; the per-message row bounds
    _columns    integer columns, the batches' packed numbers
    _usage      UsageReport, RejectReason, Rejection, ReportBatch
    _snapshot   RateSnapshot, SnapshotBatch
    _handover   ReporterWatermark, KeyHandover, Handover
    _cells      Cell, CellPublish, FoldRow, CellFold (spend-quota cells, docs/quotas.md)
    _cooldown   CooldownRow, CooldownReport, CooldownNotice (the fleet's 429 cooldown)
    _codec      SCHEMA_VERSION, the size limits, the key cache, encode/decode
"""

# `X as X`: importable, as before, but outside __all__ (plain-value codec halves, bounds).
from mesh.core.messages._cells import CELL_ROWS_MAX as CELL_ROWS_MAX
from mesh.core.messages._cells import Cell, CellFold, CellPublish, FoldRow
from mesh.core.messages._codec import MAX_ITEMS as MAX_ITEMS
from mesh.core.messages._codec import MAX_MESSAGE_BYTES, SCHEMA_VERSION, Message, decode, encode
from mesh.core.messages._codec import REPORT_ROWS_MAX as REPORT_ROWS_MAX
from mesh.core.messages._codec import from_wire as from_wire
from mesh.core.messages._codec import to_wire as to_wire
from mesh.core.messages._cooldown import COOLDOWN_MS_MAX as COOLDOWN_MS_MAX
from mesh.core.messages._cooldown import CooldownNotice, CooldownReport, CooldownRow
from mesh.core.messages._handover import HANDOVER_WATERMARKS_MAX as HANDOVER_WATERMARKS_MAX
from mesh.core.messages._handover import Handover, KeyHandover, ReporterWatermark
from mesh.core.messages._keys import HANDOVER_ROWS_MAX as HANDOVER_ROWS_MAX
from mesh.core.messages._keys import SNAPSHOT_ROWS_MAX as SNAPSHOT_ROWS_MAX
from mesh.core.messages._snapshot import RateSnapshot, SnapshotBatch
from mesh.core.messages._snapshot import above_applied as above_applied
from mesh.core.messages._snapshot import above_mask as above_mask
from mesh.core.messages._usage import Rejection, RejectReason, ReportBatch, UsageReport

__all__ = [
    "SCHEMA_VERSION",
    "MAX_MESSAGE_BYTES",
    "UsageReport",
    "RateSnapshot",
    "Rejection",
    "RejectReason",
    "ReportBatch",
    "SnapshotBatch",
    "Handover",
    "KeyHandover",
    "ReporterWatermark",
    "Cell",
    "CellPublish",
    "FoldRow",
    "CellFold",
    "CooldownRow",
    "CooldownReport",
    "CooldownNotice",
    "Message",
    "encode",
    "decode",
]

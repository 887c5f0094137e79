"""The one wire codec: messages to msgpack and back, validating everything from a peer.

On the wire a message is a msgpack array whose first element is the schema version and
second the message kind; batches carry their numbers as packed int64 columns (`_columns`).
Kept apart from the families so a message's meaning and its encoding change separately:
the families import nothing from here, and this module imports them all. `decode`
validates every field's type and range before building anything, and raises
`MessageError` naming the field.
"""

from __future__ import annotations

from typing import Any

import msgpack

from mesh.core._validate import rename
from mesh.core.messages._cells import CELL_ROWS_MAX, Cell, CellFold, CellPublish, FoldRow
from mesh.core.messages._columns import pack_column, unpack_column
from mesh.core.messages._cooldown import (
    COOLDOWN_ROWS_MAX,
    CooldownNotice,
    CooldownReport,
    CooldownRow,
)
from mesh.core.messages._handover import (
    HANDOVER_WATERMARKS_MAX,
    Handover,
    KeyHandover,
    ReporterWatermark,
)
from mesh.core.messages._keys import (
    HANDOVER_ROWS_MAX,
    MAX_ITEMS,
    REPORT_ROWS_MAX,
    SNAPSHOT_ROWS_MAX,
    key_from_wire,
    key_to_wire,
)
from mesh.core.messages._slots import (
    SLOT_KINDS,
    SlotGrants,
    SlotReports,
    slots_from_wire,
    slots_to_wire,
)
from mesh.core.messages._snapshot import SnapshotBatch
from mesh.core.messages._usage import Rejection, RejectReason, ReportBatch
from mesh.core.policy import RateKey
from mesh.errors import MeshError, MessageError, MessageTypeError
from ratemesh.unpack import UnpackBounds, unpackb

__all__ = [
    "SCHEMA_VERSION",
    "MAX_MESSAGE_BYTES",
    "MAX_ITEMS",
    "REPORT_ROWS_MAX",
    "EXTRA_FIELDS_MAX",
    "Message",
    "to_wire",
    "from_wire",
    "encode",
    "decode",
]

SCHEMA_VERSION = 3  # 2: batches as columns; 3: snapshot batches carry batch_seq
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Fields a newer peer may append to a message, or to a row of one, past those this release
# knows: skipped unread (docs/upgrade.md, "Wire schema versions"). Anything longer is refused,
# so a row's cost to skip stays bounded whatever a peer sends.
EXTRA_FIELDS_MAX = 16
# What one peer message may build, beyond its bytes (ratemesh.unpack): the largest legal
# message (256 rows of the longest keys, columns, rejections) has a few thousand elements in
# under 100 KiB, so messages up to 128 KiB decode uncounted (the hot path pays nothing).
MESSAGE_OBJECTS_MAX = 16_384
_BOUNDS = UnpackBounds(
    objects_max=MESSAGE_OBJECTS_MAX,
    container_max=4096,
    str_max=MAX_MESSAGE_BYTES,
    bin_max=MAX_MESSAGE_BYTES,
    count_from_bytes=128 * 1024,
)

# Wire keys already validated, by their decoded tuple: a batch repeats the same keys every
# sync interval, so most decode without a check. Process-wide; cleared when full.
_KEY_CACHE: dict[Any, RateKey] = {}
_KEY_CACHE_MAX = 100_000  # distinct wire keys remembered before the cache starts over

_REPORT_COLUMNS = ("sequences", "deltas", "denied", "unacked_from")
_SNAPSHOT_COLUMNS = (
    "owner_epochs",
    "versions",
    "remaining",
    "acks",
    "receiver_epochs",
    "shares_ppm",
    "active_reporters",
)
# The snapshot batch's columns after `batch_seq`, by position: each may be empty (not said)
# or absent (a peer from before it).
_SNAPSHOT_OPTIONAL = ((16, "floors_ppm"), (17, "applied_above"), (18, "applied_net"))
# Fields this release knows per message kind: the most a message carries before the ones a
# newer peer appended (EXTRA_FIELDS_MAX of them at most, skipped).
_KNOWN_FIELDS = {
    "reports": 12,
    "snapshots": 19,
    "handover": 5,
    "cells": 5,
    "folds": 5,
    "cooldown": 5,
    "cooldown_left": 5,
    "slots": 5,
    "slot_grants": 5,
}
_REASONS = {r.value: r for r in RejectReason}
_INT_ONLY = frozenset((int,))

Message = (
    ReportBatch
    | SnapshotBatch
    | Handover
    | CellPublish
    | CellFold
    | CooldownReport
    | CooldownNotice
    | SlotReports
    | SlotGrants
)


def to_wire(msg: Message) -> list[Any]:
    """A message as plain msgpack-able values (columns as packed int64)."""
    if isinstance(msg, ReportBatch):
        # A RateKey is a tuple of (str, StrEnum, int): msgpack packs it as the wire's
        # [tenant_id, metric, policy_generation] as it stands.
        return [
            SCHEMA_VERSION,
            "reports",
            msg.sender,
            msg.ring_epoch,
            msg.worker_epoch,
            msg.keys,
            pack_column(msg.sequences),
            pack_column(msg.deltas),
            pack_column(msg.denied),
            pack_column(msg.unacked_from),
            msg.heard_batch,
            pack_column(msg.since_ages),
        ]
    if isinstance(msg, SnapshotBatch):
        return [
            SCHEMA_VERSION,
            "snapshots",
            msg.sender,
            msg.ring_epoch,
            msg.owner_incarnation,
            msg.observed_at,
            msg.keys,
            pack_column(msg.owner_epochs),
            pack_column(msg.versions),
            pack_column(msg.remaining),
            pack_column(msg.acks),
            pack_column(msg.receiver_epochs),
            pack_column(msg.shares_ppm),
            pack_column(msg.active_reporters),
            [[key_to_wire(j.rate_key), j.reason.value, j.ring_epoch] for j in msg.rejections],
            msg.batch_seq,
            pack_column(msg.floors_ppm),
            pack_column(msg.applied_above),
            pack_column(msg.applied_net),
        ]
    if isinstance(msg, Handover):
        return _handover_wire(msg)
    if isinstance(msg, CellPublish):
        cells = [[key_to_wire(c.rate_key), c.period_index, c.burn] for c in msg.cells]
        return [SCHEMA_VERSION, "cells", msg.sender, msg.ring_epoch, cells]
    if isinstance(msg, CellFold):
        rows = [[key_to_wire(r.rate_key), r.period_index, r.combined, r.own] for r in msg.rows]
        return [SCHEMA_VERSION, "folds", msg.sender, msg.ring_epoch, rows]
    if isinstance(msg, (CooldownReport, CooldownNotice)):
        kind = "cooldown" if isinstance(msg, CooldownReport) else "cooldown_left"
        rows = [[key_to_wire(r.rate_key), r.ms] for r in msg.rows]
        return [SCHEMA_VERSION, kind, msg.sender, msg.ring_epoch, rows]
    if isinstance(msg, (SlotReports, SlotGrants)):  # in-flight slots (docs/policies.md)
        return slots_to_wire(SCHEMA_VERSION, msg)
    raise TypeError(f"not a mesh message: {type(msg).__name__}")


def _handover_wire(msg: Handover) -> list[Any]:
    return [
        SCHEMA_VERSION,
        "handover",
        msg.sender,
        msg.ring_epoch,
        [
            [
                key_to_wire(k.rate_key),
                k.ahead_ns,
                k.owner_epoch,
                k.version,
                [[w.worker_id, w.worker_epoch, w.watermark] for w in k.watermarks],
            ]
            for k in msg.keys
        ],
    ]


def _array(field: str, value: Any, limit: int, width: int) -> Any:
    """A wire array of at most `limit` arrays of `width` fields (and at most
    EXTRA_FIELDS_MAX more that a newer peer appended, skipped), or a MessageError."""
    if not isinstance(value, (list, tuple)):
        raise MessageTypeError(field, "must be an array")
    if len(value) > limit:
        raise MessageError(field, f"at most {limit} items, got {len(value)}")
    for i, it in enumerate(value):
        if not isinstance(it, (list, tuple)) or not width <= len(it) <= width + EXTRA_FIELDS_MAX:
            raise MessageTypeError(
                f"{field}[{i}]",
                f"must be an array of {width} fields (at most {EXTRA_FIELDS_MAX} more appended)",
            )
    return value


def _cells_from_wire(obj: Any) -> CellPublish | CellFold:
    """A CellPublish ("cells", rows of 3) or a CellFold ("folds", rows of 4): the row
    count is checked before any row is built (_array)."""
    _, kind, sender, ring_epoch, items = obj[:5]
    publish = kind == "cells"
    width = 3 if publish else 4
    out: list[Any] = []
    for i, it in enumerate(_array("cells" if publish else "rows", items, CELL_ROWS_MAX, width)):
        try:
            key = key_from_wire("rate_key", list(it[0]) if type(it[0]) is tuple else it[0])
            out.append(Cell(key, *it[1:3]) if publish else FoldRow(key, *it[1:4]))
        except MeshError as exc:
            raise rename(exc, f"{'cells' if publish else 'rows'}[{i}]", MessageError) from exc
    if publish:
        return CellPublish(sender, ring_epoch, tuple(out))
    return CellFold(sender, ring_epoch, tuple(out))


def _cooldown_from_wire(obj: Any) -> CooldownReport | CooldownNotice:
    """A CooldownReport ("cooldown") or CooldownNotice ("cooldown_left"), rows of 2."""
    _, kind, sender, ring_epoch, items = obj[:5]
    out: list[CooldownRow] = []
    for i, it in enumerate(_array("rows", items, COOLDOWN_ROWS_MAX, 2)):
        try:
            key = key_from_wire("rate_key", list(it[0]) if type(it[0]) is tuple else it[0])
            out.append(CooldownRow(key, it[1]))
        except MeshError as exc:
            raise rename(exc, f"rows[{i}]", MessageError) from exc
    cls = CooldownReport if kind == "cooldown" else CooldownNotice
    return cls(sender, ring_epoch, tuple(out))


def _handover_from_wire(obj: Any) -> Handover:
    _, _, sender, ring_epoch, items = obj[:5]
    keys = []
    rows = 0
    for i, it in enumerate(_array("keys", items, HANDOVER_ROWS_MAX, 5)):
        # Counted before a key's watermarks are built: a message over the bound is refused
        # for the cost of counting, not of decoding it.
        rows += 1 + (len(it[4]) if isinstance(it[4], (list, tuple)) else 0)
        if rows > HANDOVER_ROWS_MAX:
            raise MessageError(
                "keys", f"at most {HANDOVER_ROWS_MAX} keys and watermarks per message"
            )
        try:
            key = key_from_wire("rate_key", list(it[0]) if type(it[0]) is tuple else it[0])
            keys.append(KeyHandover(key, it[1], it[2], it[3], _watermarks(it[4])))
        except MeshError as exc:
            raise rename(exc, f"keys[{i}]", MessageError) from exc
    return Handover(sender, ring_epoch, tuple(keys))


def _watermarks(value: Any) -> tuple[ReporterWatermark, ...]:
    marks = []
    for j, w in enumerate(_array("watermarks", value, HANDOVER_WATERMARKS_MAX, 3)):
        try:
            marks.append(ReporterWatermark(*w[:3]))
        except MeshError as exc:
            raise rename(exc, f"watermarks[{j}]", MessageError) from exc
    return tuple(marks)


def _keys_from_wire(field: str, items: Any, limit: int = MAX_ITEMS) -> tuple[RateKey, ...]:
    """Wire keys to RateKeys (at most `limit`, checked before any is). Keys seen before come
    from a cache of validated ones (a batch repeats the same keys every sync interval);
    others are checked one by one."""
    if not isinstance(items, (list, tuple)):
        raise MessageTypeError(field, "must be an array of [tenant_id, metric, policy_generation]")
    if len(items) > limit:
        raise MessageError(field, f"at most {limit} items, got {len(items)}")
    cache = _KEY_CACHE
    try:
        keys = tuple(map(cache.get, items))
        # A bool or float equals an int generation; the cache must not turn 1.0 into 1.
        if None not in keys and set(map(type, map(_third, items))) <= _INT_ONLY:
            return keys  # type: ignore[return-value]
    except (TypeError, IndexError):  # unhashable or short items: the slow path names them
        pass
    out = []
    for i, it in enumerate(items):
        key = key_from_wire(f"{field}[{i}]", list(it) if type(it) is tuple else it)
        if type(it) is tuple and type(it[2]) is int:
            if len(cache) >= _KEY_CACHE_MAX:
                cache.clear()
            cache[it] = key
        out.append(key)
    return tuple(out)


def _third(item: Any) -> Any:
    return item[2]


def _rejections(items: Any) -> tuple[Rejection, ...]:
    if not isinstance(items, (list, tuple)):
        raise MessageTypeError("rejections", "must be an array")
    if len(items) > SNAPSHOT_ROWS_MAX:
        raise MessageError("rejections", f"at most {SNAPSHOT_ROWS_MAX} items, got {len(items)}")
    out = []
    for i, it in enumerate(items):
        if not isinstance(it, (list, tuple)) or not 3 <= len(it) <= 3 + EXTRA_FIELDS_MAX:
            raise MessageTypeError(
                f"rejections[{i}]",
                f"must be an array of 3 fields (at most {EXTRA_FIELDS_MAX} more appended)",
            )
        if not isinstance(it[1], str) or it[1] not in _REASONS:
            raise MessageError(f"rejections[{i}].reason", f"unknown reason {it[1]!r}")
        try:
            key = key_from_wire("rate_key", list(it[0]) if type(it[0]) is tuple else it[0])
            out.append(Rejection(key, _REASONS[it[1]], it[2]))
        except MeshError as exc:
            raise rename(exc, f"rejections[{i}]", MessageError) from exc
    return tuple(out)


def from_wire(obj: Any) -> Message:
    """Validate plain values from the wire and build the message, or raise MessageError."""
    if not isinstance(obj, (list, tuple)) or len(obj) < 2:
        raise MessageTypeError("message", "must be an array [schema, kind, ...]")
    schema, kind = obj[0], obj[1]
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise MessageError(
            "schema", f"unsupported schema version {schema!r}; this peer speaks {SCHEMA_VERSION}"
        )
    # Fields are only ever appended (docs/upgrade.md). A message of the shape before its
    # last fields (`heard_batch` and `since_ages`, `floors_ppm`, `applied_above`,
    # `applied_net`) decodes with them empty: a peer one release behind is understood. One
    # with fields past those known here (at most EXTRA_FIELDS_MAX) decodes with them
    # skipped: a peer one release ahead is understood as far as this release can.
    n_fields = len(obj)
    known = _KNOWN_FIELDS.get(kind, n_fields) if type(kind) is str else n_fields
    if n_fields > known + EXTRA_FIELDS_MAX:
        raise MessageError(
            "message",
            f"{kind!r} with {n_fields} fields: at most {EXTRA_FIELDS_MAX} past the "
            f"{known} this peer knows",
        )
    if kind == "reports" and n_fields >= 10:
        _, _, sender, ring_epoch, worker_epoch, items, *cols = obj[:10]
        keys = _keys_from_wire("keys", items, REPORT_ROWS_MAX)
        n = len(keys)
        seqs, deltas, denied, unacked = (
            unpack_column(name, c, n) for name, c in zip(_REPORT_COLUMNS, cols, strict=True)
        )
        heard: Any = obj[10] if n_fields > 10 else 0
        ages: Any = ()
        if n_fields > 11 and obj[11] != b"":  # empty: not said
            ages = unpack_column("since_ages", obj[11], n)
        return ReportBatch(
            sender, ring_epoch, worker_epoch, keys, seqs, deltas, denied, unacked, heard, ages
        )
    if kind == "snapshots" and n_fields >= 16:
        _, _, sender, ring_epoch, inc, at, items, *cols, rejs, batch_seq = obj[:16]
        keys = _keys_from_wire("keys", items, SNAPSHOT_ROWS_MAX)
        n = len(keys)
        c = [unpack_column(name, col, n) for name, col in zip(_SNAPSHOT_COLUMNS, cols, strict=True)]
        floors, above, net = (
            unpack_column(name, obj[i], n) if n_fields > i and obj[i] != b"" else ()
            for i, name in _SNAPSHOT_OPTIONAL  # empty or absent: not said
        )
        return SnapshotBatch(
            sender,
            ring_epoch,
            inc,
            at,
            keys,
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            _rejections(rejs),
            batch_seq,
            floors,
            above,
            net,
        )
    if kind == "handover" and n_fields >= 5:
        return _handover_from_wire(obj)
    if kind in ("cells", "folds") and n_fields >= 5:
        return _cells_from_wire(obj)
    if kind in ("cooldown", "cooldown_left") and n_fields >= 5:
        return _cooldown_from_wire(obj)
    if kind in SLOT_KINDS and n_fields >= 5:
        return slots_from_wire(obj)
    raise MessageError("kind", f"unknown message kind {kind!r} with {len(obj)} fields")


def encode(msg: Message) -> bytes:
    return msgpack.packb(to_wire(msg), use_bin_type=True)  # type: ignore[no-any-return]


def decode(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Bytes from a peer to a validated message; anything malformed is a MessageError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MessageTypeError("message", f"must be bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise MessageError("message", f"{len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        obj = unpackb(data, _BOUNDS, use_list=False)
    except (msgpack.UnpackException, ValueError) as exc:
        raise MessageError("message", f"not valid msgpack: {exc}") from exc
    return from_wire(obj)

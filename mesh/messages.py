"""The mesh's peer messages, and their one wire codec (msgpack).

Workers send `ReportBatch`es of `UsageReport`s to each key's owner; owners answer with
`SnapshotBatch`es of `RateSnapshot`s (and `Rejection`s for reports they will not take).
Every message is a frozen, slotted dataclass; on the wire it is a msgpack array whose first
element is the schema version and second the message kind. `decode` validates every field's
type and range before building anything, and raises `MessageError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgpack

from mesh._validate import INT_MAX, STR_MAX, check_int, check_str, rename
from mesh.errors import MeshError, MessageError, MessageTypeError
from mesh.policy import Metric, RateKey, Unit

__all__ = [
    "SCHEMA_VERSION",
    "MAX_MESSAGE_BYTES",
    "UsageReport",
    "RateSnapshot",
    "Rejection",
    "RejectReason",
    "ReportBatch",
    "SnapshotBatch",
    "Message",
    "encode",
    "decode",
]

SCHEMA_VERSION = 1
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_ITEMS = 65_536  # reports or snapshots in one batch
PPM = 1_000_000

_METRICS = {m.value: m for m in Metric}
_BYTE_METRICS = frozenset(m for m in Metric if m.unit is Unit.BYTES)
_WIRE_NAMES = {m: m.value for m in Metric}  # Enum.value is a property: look it up once


def _key(field: str, value: Any) -> RateKey:
    if type(value) is list and len(value) == 3:  # the common case, checked in one go
        tenant, metric, gen = value
        m = _METRICS.get(metric) if type(metric) is str else None
        if (m is not None and type(tenant) is str and 0 < len(tenant) <= STR_MAX
                and type(gen) is int and 1 <= gen <= INT_MAX):
            return RateKey(tenant, m, gen)
    return _key_checked(field, value)


def _key_checked(field: str, value: Any) -> RateKey:
    """Field by field, so the error names what is wrong."""
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise MessageTypeError(field, "must be [tenant_id, metric, policy_generation]")
    tenant, metric, gen = value
    check_str(f"{field}.tenant_id", tenant, error=MessageError)
    if metric not in _METRICS:
        raise MessageError(f"{field}.metric", f"unknown metric {metric!r}")
    check_int(f"{field}.policy_generation", gen, minimum=1, error=MessageError)
    return RateKey(tenant, _METRICS[metric], gen)


def _key_wire(key: RateKey) -> list[Any]:
    return [key.tenant_id, _WIRE_NAMES[key.metric], key.policy_generation]


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Usage one worker incarnation accumulated for one key (seed 004).

    `(worker_epoch, sequence)` makes it idempotent at the owner. Exactly one of the deltas
    is used, by the metric's unit; a byte delta may be negative (a short send refunded after
    its chunk was reported). `denied_delta` is demand turned away, which lets the owner
    share the remaining budget by demand rather than by past admissions. `unacked_from` is
    the worker's lowest unacknowledged sequence for the key: every sequence below it was
    applied by some owner, so a new owner (or one that forgot the worker) starts there.
    """

    rate_key: RateKey
    worker_id: str
    worker_epoch: int
    sequence: int
    iops_delta: int = 0
    byte_delta: int = 0
    denied_delta: int = 0
    unacked_from: int = 1

    def __post_init__(self) -> None:
        # The common case in one expression (an owner decodes thousands per batch); the
        # slow path below re-checks field by field to name what is wrong.
        r = self
        if (type(r.rate_key) is RateKey and type(r.worker_id) is str
                and 0 < len(r.worker_id) <= STR_MAX and type(r.worker_epoch) is int
                and type(r.sequence) is int and type(r.unacked_from) is int
                and type(r.iops_delta) is int and type(r.byte_delta) is int
                and type(r.denied_delta) is int
                and 0 <= r.worker_epoch <= INT_MAX and 1 <= r.unacked_from <= r.sequence <= INT_MAX
                and 0 <= r.denied_delta <= INT_MAX
                and ((r.iops_delta == 0 and -INT_MAX <= r.byte_delta <= INT_MAX)
                     if r.rate_key.metric in _BYTE_METRICS
                     else (r.byte_delta == 0 and -INT_MAX <= r.iops_delta <= INT_MAX))):
            return
        _validated_report(self, MessageError)

    @property
    def delta(self) -> int:
        return self.iops_delta + self.byte_delta  # validation keeps the other one at 0


def _validated_report(r: UsageReport, error: type[MeshError]) -> None:
    if not isinstance(r.rate_key, RateKey):
        raise MessageTypeError("rate_key", "must be a RateKey")
    check_str("worker_id", r.worker_id, error=error)
    check_int("worker_epoch", r.worker_epoch, minimum=0, error=error)
    check_int("sequence", r.sequence, minimum=1, error=error)
    bytes_metric = r.rate_key.metric.unit is Unit.BYTES
    if bytes_metric:
        check_int("byte_delta", r.byte_delta, minimum=-INT_MAX, error=error)
        check_int("iops_delta", r.iops_delta, maximum=0, error=error)
    else:
        check_int("iops_delta", r.iops_delta, minimum=-INT_MAX, error=error)
        check_int("byte_delta", r.byte_delta, maximum=0, error=error)
    check_int("denied_delta", r.denied_delta, error=error)
    check_int("unacked_from", r.unacked_from, minimum=1, maximum=r.sequence, error=error)


@dataclass(frozen=True, slots=True)
class RateSnapshot:
    """The owner's view of one key, addressed to one active reporter.

    `(owner_epoch, owner_incarnation, version)` orders snapshots: a worker never steps back
    to an older one. `ack_sequence_for_receiver` is the receiver's highest contiguous
    sequence that `remaining` already reflects, for `receiver_epoch`. `share_ppm` is the
    receiver's share (parts per million) of what remains, by recent demand.
    """

    rate_key: RateKey
    owner_epoch: int
    version: int
    remaining: int
    observed_at: int
    ack_sequence_for_receiver: int
    receiver_epoch: int = 0
    owner_incarnation: int = 0
    share_ppm: int = PPM
    active_reporters: int = 1

    def __post_init__(self) -> None:
        s = self
        if (type(s.rate_key) is RateKey and type(s.owner_epoch) is int
                and type(s.version) is int and type(s.remaining) is int
                and type(s.observed_at) is int and type(s.ack_sequence_for_receiver) is int
                and type(s.receiver_epoch) is int and type(s.owner_incarnation) is int
                and type(s.share_ppm) is int and type(s.active_reporters) is int
                and 0 <= s.owner_epoch <= INT_MAX and 0 <= s.version <= INT_MAX
                and 0 <= s.remaining <= INT_MAX and 0 <= s.observed_at <= INT_MAX
                and 0 <= s.ack_sequence_for_receiver <= INT_MAX
                and 0 <= s.receiver_epoch <= INT_MAX and 0 <= s.owner_incarnation <= INT_MAX
                and 0 <= s.share_ppm <= PPM and 1 <= s.active_reporters <= INT_MAX):
            return  # the common case; otherwise name the field that is wrong
        if not isinstance(self.rate_key, RateKey):
            raise MessageTypeError("rate_key", "must be a RateKey")
        for name in ("owner_epoch", "version", "remaining", "observed_at",
                     "ack_sequence_for_receiver", "receiver_epoch", "owner_incarnation"):
            check_int(name, getattr(self, name), error=MessageError)
        check_int("share_ppm", self.share_ppm, maximum=PPM, error=MessageError)
        check_int("active_reporters", self.active_reporters, minimum=1, error=MessageError)

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.owner_epoch, self.owner_incarnation, self.version)


class RejectReason(StrEnum):
    NOT_OWNER = "not_owner"  # the ring moved the key; re-route by the newer ring
    STALE_EPOCH = "stale_epoch"  # the owner's ring is older than the sender's; retry later
    POLICY_UNKNOWN = "policy_unknown"  # the owner lacks the generation; it is fetching it


_REASONS = {r.value: r for r in RejectReason}


@dataclass(frozen=True, slots=True)
class Rejection:
    """An owner refusing one key's reports. Nothing was applied; the worker retries them."""

    rate_key: RateKey
    reason: RejectReason
    ring_epoch: int

    def __post_init__(self) -> None:
        if not isinstance(self.rate_key, RateKey):
            raise MessageTypeError("rate_key", "must be a RateKey")
        if not isinstance(self.reason, RejectReason):
            raise MessageTypeError("reason", "must be a RejectReason")
        check_int("ring_epoch", self.ring_epoch, error=MessageError)


@dataclass(frozen=True, slots=True)
class ReportBatch:
    """All of one worker's reports for one owner, routed by the worker's ring epoch."""

    sender: str
    ring_epoch: int
    reports: tuple[UsageReport, ...]

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        if len(self.reports) > MAX_ITEMS:
            raise MessageError("reports", f"at most {MAX_ITEMS} per batch, got {len(self.reports)}")
        for i, r in enumerate(self.reports):
            if r.worker_id != self.sender:
                raise MessageError(f"reports[{i}].worker_id", "differs from the batch's sender")


@dataclass(frozen=True, slots=True)
class SnapshotBatch:
    """An owner's snapshots and rejections for one receiver."""

    sender: str
    ring_epoch: int
    snapshots: tuple[RateSnapshot, ...] = ()
    rejections: tuple[Rejection, ...] = ()

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        if len(self.snapshots) + len(self.rejections) > MAX_ITEMS:
            raise MessageError("snapshots", f"at most {MAX_ITEMS} items per batch")


Message = ReportBatch | SnapshotBatch


def to_wire(msg: Message) -> list[Any]:
    """A message as plain msgpack-able lists."""
    if isinstance(msg, ReportBatch):
        return [SCHEMA_VERSION, "reports", msg.sender, msg.ring_epoch, [
            [_key_wire(r.rate_key), r.worker_id, r.worker_epoch, r.sequence,
             r.iops_delta, r.byte_delta, r.denied_delta, r.unacked_from] for r in msg.reports]]
    if isinstance(msg, SnapshotBatch):
        return [SCHEMA_VERSION, "snapshots", msg.sender, msg.ring_epoch, [
            [_key_wire(s.rate_key), s.owner_epoch, s.version, s.remaining, s.observed_at,
             s.ack_sequence_for_receiver, s.receiver_epoch, s.owner_incarnation,
             s.share_ppm, s.active_reporters] for s in msg.snapshots],
            [[_key_wire(j.rate_key), j.reason.value, j.ring_epoch] for j in msg.rejections]]
    raise TypeError(f"not a mesh message: {type(msg).__name__}")


def _items(field: str, value: Any, width: int) -> list[list[Any]]:
    if not isinstance(value, list):
        raise MessageTypeError(field, "must be an array")
    if len(value) > MAX_ITEMS:
        raise MessageError(field, f"at most {MAX_ITEMS} items, got {len(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, list) or len(item) != width:
            raise MessageTypeError(f"{field}[{i}]", f"must be an array of {width} fields")
    return value


def from_wire(obj: Any) -> Message:
    """Validate plain lists from the wire and build the message, or raise MessageError."""
    if not isinstance(obj, list) or len(obj) < 2:
        raise MessageTypeError("message", "must be an array [schema, kind, ...]")
    schema, kind = obj[0], obj[1]
    if schema != SCHEMA_VERSION:
        raise MessageError("schema", f"unsupported schema version {schema!r}; "
                                     f"this peer speaks {SCHEMA_VERSION}")
    try:
        if kind == "reports" and len(obj) == 5:
            _, _, sender, ring_epoch, items = obj
            reports = []
            for i, it in enumerate(_items("reports", items, 8)):
                try:
                    reports.append(UsageReport(_key("rate_key", it[0]), *it[1:]))
                except MeshError as exc:
                    raise rename(exc, f"reports[{i}]", MessageError) from exc
            return ReportBatch(sender, ring_epoch, tuple(reports))
        if kind == "snapshots" and len(obj) == 6:
            _, _, sender, ring_epoch, snaps, rejs = obj
            snapshots, rejections = [], []
            for i, it in enumerate(_items("snapshots", snaps, 10)):
                try:
                    snapshots.append(RateSnapshot(_key("rate_key", it[0]), *it[1:]))
                except MeshError as exc:
                    raise rename(exc, f"snapshots[{i}]", MessageError) from exc
            for i, it in enumerate(_items("rejections", rejs, 3)):
                if it[1] not in _REASONS:
                    raise MessageError(f"rejections[{i}].reason", f"unknown reason {it[1]!r}")
                try:
                    rejections.append(Rejection(_key("rate_key", it[0]), _REASONS[it[1]], it[2]))
                except MeshError as exc:
                    raise rename(exc, f"rejections[{i}]", MessageError) from exc
            return SnapshotBatch(sender, ring_epoch, tuple(snapshots), tuple(rejections))
    except TypeError as exc:  # a mis-sized field list reaching a constructor
        if isinstance(exc, MeshError):
            raise
        raise MessageTypeError(str(kind), f"malformed fields: {exc}") from exc
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
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (msgpack.UnpackException, ValueError) as exc:
        raise MessageError("message", f"not valid msgpack: {exc}") from exc
    return from_wire(obj)

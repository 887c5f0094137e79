"""The mesh's peer messages, and their one wire codec (msgpack).

Workers send `ReportBatch`es of `UsageReport`s to each key's owner; owners answer with
`SnapshotBatch`es of `RateSnapshot`s (and `Rejection`s for reports they will not take).
Every message is a frozen, slotted dataclass; on the wire it is a msgpack array whose first
element is the schema version and second the message kind. `decode` validates every field's
type and range before building anything, and raises `MessageError` naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from operator import le
from typing import Any, TypeVar

import msgpack

from mesh.core._validate import INT_MAX, STR_MAX, check_int, check_str, rename
from mesh.core.messages._columns import check_column, pack_column, unpack_column
from mesh.core.policy import Metric, RateKey, Unit
from mesh.core.shares import PPM
from mesh.errors import MeshError, MessageError, MessageTypeError

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
    "Message",
    "encode",
    "decode",
]

SCHEMA_VERSION = 3  # 2: batches as columns; 3: snapshot batches carry batch_seq
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_ITEMS = 65_536  # reports or snapshots in one batch


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
    if type(metric) is not str or metric not in _METRICS:
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
    """All of one worker incarnation's reports for one owner, as columns.

    Row i is the report for `keys[i]`: `sequences[i]`, `deltas[i]` (in the metric's unit;
    negative for a refund), `denied[i]` and `unacked_from[i]` mean what the same fields of
    `UsageReport` mean. One sender, one worker_epoch and one ring epoch per batch, so they
    are said once; columns are what an owner iterates, with no object per report.
    """

    sender: str
    ring_epoch: int
    worker_epoch: int
    keys: tuple[RateKey, ...]
    sequences: tuple[int, ...]
    deltas: tuple[int, ...]
    denied: tuple[int, ...]
    unacked_from: tuple[int, ...]

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        check_int("worker_epoch", self.worker_epoch, error=MessageError)
        n = _check_keys("keys", self.keys)
        check_column("sequences", self.sequences, n, minimum=1)
        check_column("deltas", self.deltas, n, minimum=-INT_MAX)
        check_column("denied", self.denied, n)
        check_column("unacked_from", self.unacked_from, n, minimum=1)
        if not all(map(le, self.unacked_from, self.sequences)):
            pairs = zip(self.unacked_from, self.sequences, strict=True)
            i = next(i for i, (u, s) in enumerate(pairs) if u > s)
            raise MessageError(f"unacked_from[{i}]", f"must be <= sequences[{i}] "
                                                     f"({self.sequences[i]}), got "
                                                     f"{self.unacked_from[i]}")

    @classmethod
    def trusted(cls, sender: str, ring_epoch: int, worker_epoch: int,
                keys: tuple[RateKey, ...], sequences: tuple[int, ...], deltas: tuple[int, ...],
                denied: tuple[int, ...], unacked_from: tuple[int, ...]) -> ReportBatch:
        """Built by the reporter from its own state, which never holds an invalid value:
        skips the per-element checks (`decode` makes them on everything from a peer)."""
        return _unchecked(cls, (sender, ring_epoch, worker_epoch, keys, sequences, deltas,
                                denied, unacked_from))

    @classmethod
    def of(cls, sender: str, ring_epoch: int, reports: Iterable[UsageReport]) -> ReportBatch:
        """Build the columns from `UsageReport` rows (one worker incarnation's)."""
        rows = tuple(reports)
        epoch = rows[0].worker_epoch if rows else 0
        for i, r in enumerate(rows):
            if not isinstance(r, UsageReport):
                raise MessageTypeError(f"reports[{i}]", "must be a UsageReport")
            if r.worker_id != sender:
                raise MessageError(f"reports[{i}].worker_id", "differs from the batch's sender")
            if r.worker_epoch != epoch:
                raise MessageError(f"reports[{i}].worker_epoch", "differs from the batch's "
                                                                 f"worker_epoch {epoch}")
        return cls(sender, ring_epoch, epoch, tuple(r.rate_key for r in rows),
                   tuple(r.sequence for r in rows), tuple(r.delta for r in rows),
                   tuple(r.denied_delta for r in rows), tuple(r.unacked_from for r in rows))

    @property
    def reports(self) -> tuple[UsageReport, ...]:
        """The rows as `UsageReport`s (for inspection; the owner reads the columns)."""
        return tuple(
            UsageReport(k, self.sender, self.worker_epoch, s, 0, d, n, u)
            if k.metric in _BYTE_METRICS else
            UsageReport(k, self.sender, self.worker_epoch, s, d, 0, n, u)
            for k, s, d, n, u in zip(self.keys, self.sequences, self.deltas, self.denied,
                                     self.unacked_from, strict=True))

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True, slots=True)
class SnapshotBatch:
    """An owner's snapshots (as columns) and rejections for one receiver.

    Row i is `RateSnapshot` for `keys[i]`; the owner's incarnation and the observation time
    are the same for every row, so they are said once. `batch_seq` numbers the owner
    incarnation's batches to this receiver, one up each (0: unnumbered); a batch vouches
    for every view its numbered predecessors gave, back to the last number skipped.
    """

    sender: str
    ring_epoch: int
    owner_incarnation: int = 0
    observed_at: int = 0
    keys: tuple[RateKey, ...] = ()
    owner_epochs: tuple[int, ...] = ()
    versions: tuple[int, ...] = ()
    remaining: tuple[int, ...] = ()
    acks: tuple[int, ...] = ()
    receiver_epochs: tuple[int, ...] = ()
    shares_ppm: tuple[int, ...] = ()
    active_reporters: tuple[int, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    batch_seq: int = 0

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        check_int("owner_incarnation", self.owner_incarnation, error=MessageError)
        check_int("observed_at", self.observed_at, error=MessageError)
        check_int("batch_seq", self.batch_seq, error=MessageError)
        n = _check_keys("keys", self.keys)
        check_column("owner_epochs", self.owner_epochs, n)
        check_column("versions", self.versions, n)
        check_column("remaining", self.remaining, n)
        check_column("acks", self.acks, n)
        check_column("receiver_epochs", self.receiver_epochs, n)
        check_column("shares_ppm", self.shares_ppm, n, maximum=PPM)
        check_column("active_reporters", self.active_reporters, n, minimum=1)
        if type(self.rejections) is not tuple:
            raise MessageTypeError("rejections", "must be a tuple of Rejection")
        if n + len(self.rejections) > MAX_ITEMS:
            raise MessageError("keys", f"at most {MAX_ITEMS} items per batch")
        for i, j in enumerate(self.rejections):
            if not isinstance(j, Rejection):
                raise MessageTypeError(f"rejections[{i}]", "must be a Rejection")

    @classmethod
    def trusted(cls, sender: str, ring_epoch: int, owner_incarnation: int, observed_at: int,
                keys: tuple[RateKey, ...], owner_epochs: tuple[int, ...],
                versions: tuple[int, ...], remaining: tuple[int, ...], acks: tuple[int, ...],
                receiver_epochs: tuple[int, ...], shares_ppm: tuple[int, ...],
                active_reporters: tuple[int, ...], rejections: tuple[Rejection, ...] = (),
                batch_seq: int = 0) -> SnapshotBatch:
        """Built by the owner from its own state: skips the per-element checks, as
        `ReportBatch.trusted` does."""
        return _unchecked(cls, (sender, ring_epoch, owner_incarnation, observed_at, keys,
                                owner_epochs, versions, remaining, acks, receiver_epochs,
                                shares_ppm, active_reporters, rejections, batch_seq))

    @classmethod
    def of(cls, sender: str, ring_epoch: int, snapshots: Iterable[RateSnapshot] = (),
           rejections: Iterable[Rejection] = (), *, batch_seq: int = 0) -> SnapshotBatch:
        """Build the columns from `RateSnapshot` rows (one owner incarnation's, one time)."""
        rows = tuple(snapshots)
        inc = rows[0].owner_incarnation if rows else 0
        at = rows[0].observed_at if rows else 0
        for i, s in enumerate(rows):
            if not isinstance(s, RateSnapshot):
                raise MessageTypeError(f"snapshots[{i}]", "must be a RateSnapshot")
            if s.owner_incarnation != inc:
                raise MessageError(f"snapshots[{i}].owner_incarnation",
                                   f"differs from the batch's {inc}")
            if s.observed_at != at:
                raise MessageError(f"snapshots[{i}].observed_at", f"differs from the batch's {at}")
        return cls(sender, ring_epoch, inc, at, tuple(s.rate_key for s in rows),
                   tuple(s.owner_epoch for s in rows), tuple(s.version for s in rows),
                   tuple(s.remaining for s in rows),
                   tuple(s.ack_sequence_for_receiver for s in rows),
                   tuple(s.receiver_epoch for s in rows), tuple(s.share_ppm for s in rows),
                   tuple(s.active_reporters for s in rows), tuple(rejections), batch_seq)

    @property
    def snapshots(self) -> tuple[RateSnapshot, ...]:
        """The rows as `RateSnapshot`s (for inspection; the reporter reads the columns)."""
        inc, at = self.owner_incarnation, self.observed_at
        return tuple(
            RateSnapshot(k, e, v, r, at, a, re, inc, sp, ar)
            for k, e, v, r, a, re, sp, ar in zip(
                self.keys, self.owner_epochs, self.versions, self.remaining, self.acks,
                self.receiver_epochs, self.shares_ppm, self.active_reporters, strict=True))


HANDOVER_WATERMARKS_MAX = 4096  # reporters' records per handed-over key (more: resends recount)


@dataclass(frozen=True, slots=True)
class ReporterWatermark:
    """One reporter's idempotency record for a handed-over key: every sequence of
    `worker_epoch` up to `watermark` is already in the handed state, so a resend of one
    (its ack was lost) is a duplicate at the new owner, not new usage."""

    worker_id: str
    worker_epoch: int
    watermark: int

    def __post_init__(self) -> None:
        check_str("worker_id", self.worker_id, error=MessageError)
        check_int("worker_epoch", self.worker_epoch, error=MessageError)
        check_int("watermark", self.watermark, error=MessageError)


@dataclass(frozen=True, slots=True)
class KeyHandover:
    """One key's meter state, from a leaving owner to the key's next owner.

    `ahead_ns` is how far the key's TAT was ahead of the sender's clock when it was sent,
    rounded up (0: the bucket was full). Members' monotonic clocks differ, so no absolute
    time crosses the wire; time in transit is lost, which only makes the receiver stricter.
    """

    rate_key: RateKey
    ahead_ns: int
    owner_epoch: int
    version: int
    watermarks: tuple[ReporterWatermark, ...] = ()

    def __post_init__(self) -> None:
        if type(self.rate_key) is not RateKey:
            raise MessageTypeError("rate_key", "must be a RateKey")
        check_int("ahead_ns", self.ahead_ns, error=MessageError)
        check_int("owner_epoch", self.owner_epoch, error=MessageError)
        check_int("version", self.version, error=MessageError)
        if type(self.watermarks) is not tuple:
            raise MessageTypeError("watermarks", "must be a tuple of ReporterWatermark")
        if len(self.watermarks) > HANDOVER_WATERMARKS_MAX:
            raise MessageError("watermarks", f"at most {HANDOVER_WATERMARKS_MAX} per key, "
                                             f"got {len(self.watermarks)}")
        seen: set[str] = set()
        for i, w in enumerate(self.watermarks):
            if not isinstance(w, ReporterWatermark):
                raise MessageTypeError(f"watermarks[{i}]", "must be a ReporterWatermark")
            if w.worker_id in seen:
                raise MessageError(f"watermarks[{i}].worker_id", f"{w.worker_id!r} repeated")
            seen.add(w.worker_id)


@dataclass(frozen=True, slots=True)
class Handover:
    """A gracefully leaving owner's keys for one next owner (issue 4). `ring_epoch` is the
    ring the sender owned them in."""

    sender: str
    ring_epoch: int
    keys: tuple[KeyHandover, ...]

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        if type(self.keys) is not tuple:
            raise MessageTypeError("keys", "must be a tuple of KeyHandover")
        if len(self.keys) > MAX_ITEMS:
            raise MessageError("keys", f"at most {MAX_ITEMS} per message, got {len(self.keys)}")
        seen: set[RateKey] = set()
        for i, k in enumerate(self.keys):
            if not isinstance(k, KeyHandover):
                raise MessageTypeError(f"keys[{i}]", "must be a KeyHandover")
            if k.rate_key in seen:
                raise MessageError(f"keys[{i}].rate_key", "repeated in this hand-over")
            seen.add(k.rate_key)


def _handover_wire(msg: Handover) -> list[Any]:
    return [SCHEMA_VERSION, "handover", msg.sender, msg.ring_epoch, [
        [_key_wire(k.rate_key), k.ahead_ns, k.owner_epoch, k.version,
         [[w.worker_id, w.worker_epoch, w.watermark] for w in k.watermarks]] for k in msg.keys]]


def _array(field: str, value: Any, limit: int, width: int) -> Any:
    """A wire array of at most `limit` arrays of `width` fields, or a MessageError."""
    if not isinstance(value, (list, tuple)):
        raise MessageTypeError(field, "must be an array")
    if len(value) > limit:
        raise MessageError(field, f"at most {limit} items, got {len(value)}")
    for i, it in enumerate(value):
        if not isinstance(it, (list, tuple)) or len(it) != width:
            raise MessageTypeError(f"{field}[{i}]", f"must be an array of {width} fields")
    return value


def _handover_from_wire(obj: Any) -> Handover:
    _, _, sender, ring_epoch, items = obj
    keys = []
    for i, it in enumerate(_array("keys", items, MAX_ITEMS, 5)):
        try:
            keys.append(KeyHandover(_key("rate_key", list(it[0]) if type(it[0]) is tuple
                                         else it[0]), it[1], it[2], it[3], _watermarks(it[4])))
        except MeshError as exc:
            raise rename(exc, f"keys[{i}]", MessageError) from exc
    return Handover(sender, ring_epoch, tuple(keys))


def _watermarks(value: Any) -> tuple[ReporterWatermark, ...]:
    marks = []
    for j, w in enumerate(_array("watermarks", value, HANDOVER_WATERMARKS_MAX, 3)):
        try:
            marks.append(ReporterWatermark(*w))
        except MeshError as exc:
            raise rename(exc, f"watermarks[{j}]", MessageError) from exc
    return tuple(marks)


_T = TypeVar("_T")


def _unchecked(cls: type[_T], values: tuple[Any, ...]) -> _T:
    """A frozen dataclass instance without __post_init__: what its __init__ does, minus
    the checks (for the cores' own output; never for anything from a peer)."""
    obj = object.__new__(cls)
    for name, value in zip(cls.__slots__, values, strict=True):  # type: ignore[attr-defined]
        object.__setattr__(obj, name, value)
    return obj


def _check_keys(field: str, keys: Any) -> int:
    if type(keys) is not tuple:
        raise MessageTypeError(field, f"must be a tuple of RateKey, got {type(keys).__name__}")
    if len(keys) > MAX_ITEMS:
        raise MessageError(field, f"at most {MAX_ITEMS} per batch, got {len(keys)}")
    if keys and not set(map(type, keys)) <= _RATE_KEY_ONLY:
        i = next(i for i, k in enumerate(keys) if type(k) is not RateKey)
        raise MessageTypeError(f"{field}[{i}]", "must be a RateKey")
    return len(keys)


Message = ReportBatch | SnapshotBatch | Handover


def to_wire(msg: Message) -> list[Any]:
    """A message as plain msgpack-able values (columns as packed int64)."""
    if isinstance(msg, ReportBatch):
        # A RateKey is a tuple of (str, StrEnum, int): msgpack packs it as the wire's
        # [tenant_id, metric, policy_generation] as it stands.
        return [SCHEMA_VERSION, "reports", msg.sender, msg.ring_epoch, msg.worker_epoch,
                msg.keys, pack_column(msg.sequences),
                pack_column(msg.deltas), pack_column(msg.denied), pack_column(msg.unacked_from)]
    if isinstance(msg, SnapshotBatch):
        return [SCHEMA_VERSION, "snapshots", msg.sender, msg.ring_epoch, msg.owner_incarnation,
                msg.observed_at, msg.keys,
                pack_column(msg.owner_epochs), pack_column(msg.versions),
                pack_column(msg.remaining), pack_column(msg.acks),
                pack_column(msg.receiver_epochs), pack_column(msg.shares_ppm),
                pack_column(msg.active_reporters),
                [[_key_wire(j.rate_key), j.reason.value, j.ring_epoch] for j in msg.rejections],
                msg.batch_seq]
    if isinstance(msg, Handover):
        return _handover_wire(msg)
    raise TypeError(f"not a mesh message: {type(msg).__name__}")


def _keys(field: str, items: Any) -> tuple[RateKey, ...]:
    """Wire keys to RateKeys. Keys seen before come from a cache of validated ones (a
    batch repeats the same keys every sync interval); others are checked one by one."""
    if not isinstance(items, (list, tuple)):
        raise MessageTypeError(field, "must be an array of [tenant_id, metric, policy_generation]")
    if len(items) > MAX_ITEMS:
        raise MessageError(field, f"at most {MAX_ITEMS} items, got {len(items)}")
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
        key = _key(f"{field}[{i}]", list(it) if type(it) is tuple else it)
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
    if len(items) > MAX_ITEMS:
        raise MessageError("rejections", f"at most {MAX_ITEMS} items, got {len(items)}")
    out = []
    for i, it in enumerate(items):
        if not isinstance(it, (list, tuple)) or len(it) != 3:
            raise MessageTypeError(f"rejections[{i}]", "must be an array of 3 fields")
        if not isinstance(it[1], str) or it[1] not in _REASONS:
            raise MessageError(f"rejections[{i}].reason", f"unknown reason {it[1]!r}")
        try:
            out.append(Rejection(_key("rate_key", list(it[0]) if type(it[0]) is tuple else it[0]),
                                 _REASONS[it[1]], it[2]))
        except MeshError as exc:
            raise rename(exc, f"rejections[{i}]", MessageError) from exc
    return tuple(out)


def from_wire(obj: Any) -> Message:
    """Validate plain values from the wire and build the message, or raise MessageError."""
    if not isinstance(obj, (list, tuple)) or len(obj) < 2:
        raise MessageTypeError("message", "must be an array [schema, kind, ...]")
    schema, kind = obj[0], obj[1]
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise MessageError("schema", f"unsupported schema version {schema!r}; "
                                     f"this peer speaks {SCHEMA_VERSION}")
    if kind == "reports" and len(obj) == 10:
        _, _, sender, ring_epoch, worker_epoch, items, *cols = obj
        keys = _keys("keys", items)
        n = len(keys)
        return ReportBatch(sender, ring_epoch, worker_epoch, keys, *(
            unpack_column(name, c, n) for name, c in zip(_REPORT_COLUMNS, cols, strict=True)))
    if kind == "snapshots" and len(obj) == 16:
        _, _, sender, ring_epoch, inc, at, items, *cols, rejs, batch_seq = obj
        keys = _keys("keys", items)
        n = len(keys)
        c = [unpack_column(name, col, n) for name, col in zip(_SNAPSHOT_COLUMNS, cols, strict=True)]
        return SnapshotBatch(sender, ring_epoch, inc, at, keys, c[0], c[1], c[2], c[3], c[4],
                             c[5], c[6], _rejections(rejs), batch_seq)
    if kind == "handover" and len(obj) == 5:
        return _handover_from_wire(obj)
    raise MessageError("kind", f"unknown message kind {kind!r} with {len(obj)} fields")


_REPORT_COLUMNS = ("sequences", "deltas", "denied", "unacked_from")
_SNAPSHOT_COLUMNS = ("owner_epochs", "versions", "remaining", "acks", "receiver_epochs",
                     "shares_ppm", "active_reporters")
_KEY_CACHE: dict[Any, RateKey] = {}
_KEY_CACHE_MAX = 100_000
_INT_ONLY = frozenset((int,))
_RATE_KEY_ONLY = frozenset((RateKey,))


def encode(msg: Message) -> bytes:
    return msgpack.packb(to_wire(msg), use_bin_type=True)  # type: ignore[no-any-return]


def decode(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Bytes from a peer to a validated message; anything malformed is a MessageError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MessageTypeError("message", f"must be bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise MessageError("message", f"{len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=False)
    except (msgpack.UnpackException, ValueError) as exc:
        raise MessageError("message", f"not valid msgpack: {exc}") from exc
    return from_wire(obj)

"""Usage reports: what a worker tells a key's owner, and how an owner refuses them.

A worker sends one `ReportBatch` per owner per sync interval, its `UsageReport` rows as
columns; an owner that will not take a key's reports answers with a `Rejection` (which
rides back in a `SnapshotBatch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from operator import le
from typing import TypeVar

from mesh.core._validate import INT_MAX, STR_MAX, check_int, check_str
from mesh.core.messages._columns import check_column, unchecked
from mesh.core.messages._keys import REPORT_ROWS_MAX, check_keys, is_byte_metric
from mesh.core.policy import RateKey
from mesh.errors import MeshError, MessageError, MessageTypeError

__all__ = ["UsageReport", "RejectReason", "Rejection", "ReportBatch"]


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
        if (
            type(r.rate_key) is RateKey
            and type(r.worker_id) is str
            and 0 < len(r.worker_id) <= STR_MAX
            and type(r.worker_epoch) is int
            and type(r.sequence) is int
            and type(r.unacked_from) is int
            and type(r.iops_delta) is int
            and type(r.byte_delta) is int
            and type(r.denied_delta) is int
            and 0 <= r.worker_epoch <= INT_MAX
            and 1 <= r.unacked_from <= r.sequence <= INT_MAX
            and 0 <= r.denied_delta <= INT_MAX
            and (
                (r.iops_delta == 0 and -INT_MAX <= r.byte_delta <= INT_MAX)
                if is_byte_metric(r.rate_key.metric)
                else (r.byte_delta == 0 and -INT_MAX <= r.iops_delta <= INT_MAX)
            )
        ):
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
    bytes_metric = is_byte_metric(r.rate_key.metric)
    if bytes_metric:
        check_int("byte_delta", r.byte_delta, minimum=-INT_MAX, error=error)
        check_int("iops_delta", r.iops_delta, maximum=0, error=error)
    else:
        check_int("iops_delta", r.iops_delta, minimum=-INT_MAX, error=error)
        check_int("byte_delta", r.byte_delta, maximum=0, error=error)
    check_int("denied_delta", r.denied_delta, error=error)
    check_int("unacked_from", r.unacked_from, minimum=1, maximum=r.sequence, error=error)


class RejectReason(StrEnum):
    NOT_OWNER = "not_owner"  # the ring moved the key; re-route by the newer ring
    STALE_EPOCH = "stale_epoch"  # the owner's ring is older than the sender's; retry later
    POLICY_UNKNOWN = "policy_unknown"  # the owner lacks the generation; it is fetching it


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
    `heard_batch` is the newest `batch_seq` the sender has received from this owner (0:
    none), and `since_ages[i]` how long before sending the view of `keys[i]` began counting
    its floor's wait (empty: not said): what anchor the owner's escrow of its floors
    (docs/partitions.md).
    """

    sender: str
    ring_epoch: int
    worker_epoch: int
    keys: tuple[RateKey, ...]
    sequences: tuple[int, ...]
    deltas: tuple[int, ...]
    denied: tuple[int, ...]
    unacked_from: tuple[int, ...]
    heard_batch: int = 0
    since_ages: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        check_int("worker_epoch", self.worker_epoch, error=MessageError)
        check_int("heard_batch", self.heard_batch, error=MessageError)
        n = check_keys("keys", self.keys)
        if n > REPORT_ROWS_MAX:
            raise MessageError("keys", f"at most {REPORT_ROWS_MAX} reports per batch, got {n}")
        check_column("sequences", self.sequences, n, minimum=1)
        check_column("deltas", self.deltas, n, minimum=-INT_MAX)
        check_column("denied", self.denied, n)
        check_column("unacked_from", self.unacked_from, n, minimum=1)
        if not all(map(le, self.unacked_from, self.sequences)):
            pairs = zip(self.unacked_from, self.sequences, strict=True)
            i = next(i for i, (u, s) in enumerate(pairs) if u > s)
            raise MessageError(
                f"unacked_from[{i}]",
                f"must be <= sequences[{i}] ({self.sequences[i]}), got {self.unacked_from[i]}",
            )
        if self.since_ages != ():
            check_column("since_ages", self.since_ages, n)

    @classmethod
    def trusted(
        cls,
        sender: str,
        ring_epoch: int,
        worker_epoch: int,
        keys: tuple[RateKey, ...],
        sequences: tuple[int, ...],
        deltas: tuple[int, ...],
        denied: tuple[int, ...],
        unacked_from: tuple[int, ...],
        heard_batch: int = 0,
        since_ages: tuple[int, ...] = (),
    ) -> ReportBatch:
        """Built by the reporter from its own state, which never holds an invalid value:
        skips the per-element checks (`decode` makes them on everything from a peer)."""
        return unchecked(
            cls,
            (
                sender,
                ring_epoch,
                worker_epoch,
                keys,
                sequences,
                deltas,
                denied,
                unacked_from,
                heard_batch,
                since_ages,
            ),
        )

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
                raise MessageError(
                    f"reports[{i}].worker_epoch", f"differs from the batch's worker_epoch {epoch}"
                )
        return cls(
            sender,
            ring_epoch,
            epoch,
            tuple(r.rate_key for r in rows),
            tuple(r.sequence for r in rows),
            tuple(r.delta for r in rows),
            tuple(r.denied_delta for r in rows),
            tuple(r.unacked_from for r in rows),
        )

    def rows(self, pick: slice | Sequence[int]) -> ReportBatch:
        """This batch with only the rows `pick` names (a slice, or indices in order): a
        cut or a deduplicated batch, validated already. What is said once per batch
        (sender, epochs, `heard_batch`) stays, and `since_ages` is cut with the rows, so an
        owner anchors a slice's floors as it would the whole batch's."""
        return ReportBatch.trusted(
            self.sender,
            self.ring_epoch,
            self.worker_epoch,
            _cut(self.keys, pick),
            _cut(self.sequences, pick),
            _cut(self.deltas, pick),
            _cut(self.denied, pick),
            _cut(self.unacked_from, pick),
            self.heard_batch,
            _cut(self.since_ages, pick) if self.since_ages else (),
        )

    @property
    def reports(self) -> tuple[UsageReport, ...]:
        """The rows as `UsageReport`s (for inspection; the owner reads the columns)."""
        return tuple(
            UsageReport(k, self.sender, self.worker_epoch, s, 0, d, n, u)
            if is_byte_metric(k.metric)
            else UsageReport(k, self.sender, self.worker_epoch, s, d, 0, n, u)
            for k, s, d, n, u in zip(
                self.keys, self.sequences, self.deltas, self.denied, self.unacked_from, strict=True
            )
        )

    def __len__(self) -> int:
        return len(self.keys)


_T = TypeVar("_T")


def _cut(column: tuple[_T, ...], pick: slice | Sequence[int]) -> tuple[_T, ...]:
    return column[pick] if isinstance(pick, slice) else tuple(column[i] for i in pick)

"""Snapshots: what a key's owner tells each of the key's reporters.

An owner answers a worker's reports with one `SnapshotBatch` of `RateSnapshot` rows (as
columns) and the `Rejection`s of keys it would not take; the reporter turns each row into
its local allowance.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mesh.core._validate import INT_MAX, check_int, check_str
from mesh.core.messages._columns import check_column, unchecked
from mesh.core.messages._keys import SNAPSHOT_ROWS_MAX, check_keys
from mesh.core.messages._usage import Rejection
from mesh.core.policy import RateKey
from mesh.core.shares import PPM
from mesh.errors import MessageError, MessageTypeError

__all__ = ["RateSnapshot", "SnapshotBatch", "ABOVE_BITS", "above_mask", "above_applied"]

# `SnapshotBatch.applied_above`: bit j says that the receiver's sequence `ack + 2 + j` (past
# the gap at `ack + 1`) is applied and reflected in `remaining`. 62 bits keep the mask a
# positive int64; a worker holds at most `inflight_reports_max` (8) reports of a key.
ABOVE_BITS = 62
ABOVE_MAX = (1 << ABOVE_BITS) - 1


def above_mask(watermark: int, above: Iterable[int]) -> int:
    """The owner's side: the bits of the applied sequences `above` its `watermark` (the
    `acks` it sends), those within ABOVE_BITS of it."""
    mask = 0
    for seq in above:
        j = seq - watermark - 2
        if 0 <= j < ABOVE_BITS:
            mask |= 1 << j
    return mask


def above_applied(mask: int, ack: int, sequence: int) -> bool:
    """The receiver's side: whether `mask` (with `ack`) says `sequence` is applied."""
    j = sequence - ack - 2
    return 0 <= j < ABOVE_BITS and (mask >> j) & 1 == 1


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
        if (
            type(s.rate_key) is RateKey
            and type(s.owner_epoch) is int
            and type(s.version) is int
            and type(s.remaining) is int
            and type(s.observed_at) is int
            and type(s.ack_sequence_for_receiver) is int
            and type(s.receiver_epoch) is int
            and type(s.owner_incarnation) is int
            and type(s.share_ppm) is int
            and type(s.active_reporters) is int
            and 0 <= s.owner_epoch <= INT_MAX
            and 0 <= s.version <= INT_MAX
            and 0 <= s.remaining <= INT_MAX
            and 0 <= s.observed_at <= INT_MAX
            and 0 <= s.ack_sequence_for_receiver <= INT_MAX
            and 0 <= s.receiver_epoch <= INT_MAX
            and 0 <= s.owner_incarnation <= INT_MAX
            and 0 <= s.share_ppm <= PPM
            and 1 <= s.active_reporters <= INT_MAX
        ):
            return  # the common case; otherwise name the field that is wrong
        if not isinstance(self.rate_key, RateKey):
            raise MessageTypeError("rate_key", "must be a RateKey")
        for name in (
            "owner_epoch",
            "version",
            "remaining",
            "observed_at",
            "ack_sequence_for_receiver",
            "receiver_epoch",
            "owner_incarnation",
        ):
            check_int(name, getattr(self, name), error=MessageError)
        check_int("share_ppm", self.share_ppm, maximum=PPM, error=MessageError)
        check_int("active_reporters", self.active_reporters, minimum=1, error=MessageError)

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.owner_epoch, self.owner_incarnation, self.version)


@dataclass(frozen=True, slots=True)
class SnapshotBatch:
    """An owner's snapshots (as columns) and rejections for one receiver.

    Row i is `RateSnapshot` for `keys[i]`; the owner's incarnation and the observation time
    are the same for every row, so they are said once. `batch_seq` numbers the owner
    incarnation's batches to this receiver, one up each (0: unnumbered); a batch vouches
    for every view its numbered predecessors gave, back to the last number skipped.
    `floors_ppm[i]` is the floor the owner promises the receiver for `keys[i]` should it be
    cut off (docs/partitions.md), ppm of R per second; empty: none promised.
    `applied_above[i]` is a selective acknowledgement: the receiver's reports of `keys[i]`
    past the gap after `acks[i]` that `remaining[i]` already reflects (`above_mask`), so
    that the receiver stops subtracting their usage from its allowance while it resends
    the gap; empty: none. Under jitter, reports overtake each other all the time, and
    without it a busy worker subtracted the usage of every report past a gap twice, once
    in `remaining` and once as unacknowledged (the flash crowd).
    `applied_net[i]` is the net usage (sub-units) of the receiver's reports of `keys[i]`
    that the owner applied to the key since it began its record of the receiver there:
    what it took, where `acks` only say what it has seen. A worker compares its growth
    with what the acknowledgements covered, so usage acknowledged and never applied (a
    report taken for a duplicate, a refused claim) shows in its excess estimate
    (`GlobalGate.note_applied`); empty: not said (an owner from before it).
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
    floors_ppm: tuple[int, ...] = ()
    applied_above: tuple[int, ...] = ()
    applied_net: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        check_int("owner_incarnation", self.owner_incarnation, error=MessageError)
        check_int("observed_at", self.observed_at, error=MessageError)
        check_int("batch_seq", self.batch_seq, error=MessageError)
        n = check_keys("keys", self.keys)
        check_column("owner_epochs", self.owner_epochs, n)
        check_column("versions", self.versions, n)
        check_column("remaining", self.remaining, n)
        check_column("acks", self.acks, n)
        check_column("receiver_epochs", self.receiver_epochs, n)
        check_column("shares_ppm", self.shares_ppm, n, maximum=PPM)
        check_column("active_reporters", self.active_reporters, n, minimum=1)
        if self.floors_ppm != ():
            check_column("floors_ppm", self.floors_ppm, n, maximum=PPM)
        if self.applied_above != ():
            check_column("applied_above", self.applied_above, n, maximum=ABOVE_MAX)
        if self.applied_net != ():
            check_column("applied_net", self.applied_net, n)
        if type(self.rejections) is not tuple:
            raise MessageTypeError("rejections", "must be a tuple of Rejection")
        if n + len(self.rejections) > SNAPSHOT_ROWS_MAX:
            raise MessageError(
                "keys",
                f"at most {SNAPSHOT_ROWS_MAX} snapshots and rejections per batch, "
                f"got {n + len(self.rejections)}",
            )
        for i, j in enumerate(self.rejections):
            if not isinstance(j, Rejection):
                raise MessageTypeError(f"rejections[{i}]", "must be a Rejection")

    @classmethod
    def trusted(
        cls,
        sender: str,
        ring_epoch: int,
        owner_incarnation: int,
        observed_at: int,
        keys: tuple[RateKey, ...],
        owner_epochs: tuple[int, ...],
        versions: tuple[int, ...],
        remaining: tuple[int, ...],
        acks: tuple[int, ...],
        receiver_epochs: tuple[int, ...],
        shares_ppm: tuple[int, ...],
        active_reporters: tuple[int, ...],
        rejections: tuple[Rejection, ...] = (),
        batch_seq: int = 0,
        floors_ppm: tuple[int, ...] = (),
        applied_above: tuple[int, ...] = (),
        applied_net: tuple[int, ...] = (),
    ) -> SnapshotBatch:
        """Built by the owner from its own state: skips the per-element checks, as
        `ReportBatch.trusted` does."""
        return unchecked(
            cls,
            (
                sender,
                ring_epoch,
                owner_incarnation,
                observed_at,
                keys,
                owner_epochs,
                versions,
                remaining,
                acks,
                receiver_epochs,
                shares_ppm,
                active_reporters,
                rejections,
                batch_seq,
                floors_ppm,
                applied_above,
                applied_net,
            ),
        )

    @classmethod
    def of(
        cls,
        sender: str,
        ring_epoch: int,
        snapshots: Iterable[RateSnapshot] = (),
        rejections: Iterable[Rejection] = (),
        *,
        batch_seq: int = 0,
    ) -> SnapshotBatch:
        """Build the columns from `RateSnapshot` rows (one owner incarnation's, one time)."""
        rows = tuple(snapshots)
        inc = rows[0].owner_incarnation if rows else 0
        at = rows[0].observed_at if rows else 0
        for i, s in enumerate(rows):
            if not isinstance(s, RateSnapshot):
                raise MessageTypeError(f"snapshots[{i}]", "must be a RateSnapshot")
            if s.owner_incarnation != inc:
                raise MessageError(
                    f"snapshots[{i}].owner_incarnation", f"differs from the batch's {inc}"
                )
            if s.observed_at != at:
                raise MessageError(f"snapshots[{i}].observed_at", f"differs from the batch's {at}")
        return cls(
            sender,
            ring_epoch,
            inc,
            at,
            tuple(s.rate_key for s in rows),
            tuple(s.owner_epoch for s in rows),
            tuple(s.version for s in rows),
            tuple(s.remaining for s in rows),
            tuple(s.ack_sequence_for_receiver for s in rows),
            tuple(s.receiver_epoch for s in rows),
            tuple(s.share_ppm for s in rows),
            tuple(s.active_reporters for s in rows),
            tuple(rejections),
            batch_seq,
        )

    @property
    def snapshots(self) -> tuple[RateSnapshot, ...]:
        """The rows as `RateSnapshot`s (for inspection; the reporter reads the columns)."""
        inc, at = self.owner_incarnation, self.observed_at
        return tuple(
            RateSnapshot(k, e, v, r, at, a, re, inc, sp, ar)
            for k, e, v, r, a, re, sp, ar in zip(
                self.keys,
                self.owner_epochs,
                self.versions,
                self.remaining,
                self.acks,
                self.receiver_epochs,
                self.shares_ppm,
                self.active_reporters,
                strict=True,
            )
        )

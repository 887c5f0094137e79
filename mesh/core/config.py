"""Timing and sizing knobs of the mesh core, with seed 004's defaults. Units are in names."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from mesh.core._validate import check_int, rename
from mesh.core.messages import REPORT_ROWS_MAX, SNAPSHOT_ROWS_MAX
from mesh.errors import ConfigError

__all__ = ["CoreConfig", "MS", "PARTITION_FLOOR_MS"]

MS = 1_000_000  # ns per ms
_MAY_BE_ZERO = frozenset({"partition_floor_ms"})  # 0 turns the feature off
# A worker floors a key only on a snapshot row received at most this many reporter leases
# before its owner's last word; the owner escrows the keys it sent a row of within this (and
# the slack of `escrow_recent_ns`) before it last heard from the worker. Short, so that the
# share escrowed is a recent one (the largest sent over about twice this, `share_window_ns`).
FLOOR_RECENT_LEASES = 2
# A floor follows the usage a member reported over this many reporter leases (the owner's
# window, `floor_window_ns`), counted in grains of a quarter of it: long enough to see a
# sparse reporter's rate, short enough that an old burst of use is soon not escrowed.
FLOOR_WINDOW_LEASES = 8
FLOOR_GRAINS = 4
# The span of a cut-off worker's floor, the default: below membership's failure detection
# (the etcd lease, 5 s by default), so the floor has ended before the ring can drop the
# member and its owner stop escrowing it (docs/partitions.md). Set it lower with a shorter
# lease; 0 turns floors off.
PARTITION_FLOOR_MS = 2000


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Everything the reporter, owner and admission cores need to know about time and size.

    The envelope `N*b + R*d` depends on these: `sync_interval_ms` and the network make d,
    `snapshot_ttl_ms` bounds how long a view may be spent without news from its owner.
    """

    sync_interval_ms: int = 5
    snapshot_ttl_ms: int = 20
    report_threshold_units: int = 32
    report_threshold_bytes: int = 64 * 1024
    reporter_lease_ms: int = 50  # an owner keeps sending snapshots this long after a report
    tenant_queue_max: int = 1024
    inflight_reports_max: int = 8  # per key; beyond it usage accumulates into the next report
    reorder_window: int = 64  # owner applies out-of-order sequences this far past the ack
    # Snapshots (and rejections) per message; a full batch is sent at once. At most
    # SNAPSHOT_ROWS_MAX, the most a peer takes in one batch.
    snapshot_batch_max: int = SNAPSHOT_ROWS_MAX
    reporters_per_key_max: int = 4096
    idempotency_retention_ms: int = 60_000  # tombstones: owner remembers (epoch, seq) this long
    demand_window_ms: int = 20  # owner shares `remaining` by demand seen over ~this long
    share_floor_ppm: int = 62_500  # 1/16 of the budget is split evenly, so idle workers can start
    bootstrap_divisor: int = 1  # bootstrap allowance = ceil(b / (N_live * divisor))
    owner_unreachable_ms: int = 100  # unacked reports older than this: owner_unreachable
    report_retry_ms: int = 15  # an unacknowledged report is sent again after at least this
    # ... and at most this (adaptive per owner, doubling per resend: reporter/_rto). Where
    # messages are lost one by one (the simulator), resend soon; a node's peer streams are
    # reliable and say when they reconnect (Reporter.link_reset), so its default is longer.
    report_retry_max_ms: int = 15
    report_batch_max: int = REPORT_ROWS_MAX  # reports per message to one owner, at most that
    views_max: int = 1_000_000  # (tenant, metric) views per worker; idle ones go beyond it
    # A view that holds nothing (a full local bucket; a global view with all usage
    # acknowledged and its snapshot expired) is forgotten by the next sweep: one starts
    # every views_idle_ms and visits VIEWS_SWEEP_SLICE views a tick, so an idle view is gone
    # within about twice this (Admission.tick). Rebuilding one on its next use loses nothing.
    views_idle_ms: int = 10_000
    # Serving through partitions (docs/partitions.md): a worker cut off from a key's owner
    # spends its floor (the least of its share, R / ring members and 4x its recent usage)
    # for at most this long, and the owner charges the key an escrow for it. 0: no floor, a
    # cut-off view admits nothing.
    partition_floor_ms: int = PARTITION_FLOOR_MS
    # Spend quotas (docs/quotas.md): how often a worker publishes its changed cells to each
    # key's owner (seed 002's one-second flush); a peer's unfolded burn is at most this old.
    quota_publish_ms: int = 1_000

    def __post_init__(self) -> None:
        for f in fields(self):
            check_int(f.name, getattr(self, f.name), minimum=0 if f.name in _MAY_BE_ZERO else 1)
        if self.snapshot_ttl_ms < self.sync_interval_ms:
            raise ConfigError("snapshot_ttl_ms", "must be at least sync_interval_ms")
        if self.report_retry_max_ms < self.report_retry_ms:
            raise ConfigError("report_retry_max_ms", "must be at least report_retry_ms")
        if self.report_batch_max > REPORT_ROWS_MAX:
            raise ConfigError(
                "report_batch_max",
                f"must be <= {REPORT_ROWS_MAX} (the most reports a peer takes in one batch)",
            )
        if self.snapshot_batch_max > SNAPSHOT_ROWS_MAX:
            raise ConfigError(
                "snapshot_batch_max",
                f"must be <= {SNAPSHOT_ROWS_MAX} (the most snapshots a peer takes in one batch)",
            )
        if self.share_floor_ppm > 1_000_000:
            raise ConfigError("share_floor_ppm", "must be <= 1000000")

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "core") -> CoreConfig:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ConfigError(where, f"must be a mapping, got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        for key in data:
            if key not in names:
                raise ConfigError(f"{where}.{key}", "unknown key")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise rename(exc, where) from exc

    @property
    def sync_interval_ns(self) -> int:
        return self.sync_interval_ms * MS

    @property
    def views_idle_ns(self) -> int:
        return self.views_idle_ms * MS

    @property
    def snapshot_ttl_ns(self) -> int:
        return self.snapshot_ttl_ms * MS

    @property
    def owner_unreachable_ns(self) -> int:
        """Beyond it a report's wait is an outage, not propagation (d's horizon)."""
        return self.owner_unreachable_ms * MS

    @property
    def floor_ns(self) -> int:
        """How long a cut-off worker may spend its floor (`partition_floor_ms`)."""
        return self.partition_floor_ms * MS

    @property
    def escrow_after_ns(self) -> int:
        """How long a member must be silent (no batch at all) before its owner escrows its
        floors: longer than a busy member's pause between batches (one per sync interval),
        by a TTL for the trips and a lost batch (docs/partitions.md)."""
        return (self.snapshot_ttl_ms + 2 * self.sync_interval_ms) * MS

    @property
    def floor_wait_ns(self) -> int:
        """How long after its owner's last word a worker waits before its floor opens: the
        owner's silence threshold (`escrow_after_ns`, after which it escrows), then a TTL,
        which covers the reply lost in the cut (a sync interval) and the trips."""
        return self.escrow_after_ns + self.snapshot_ttl_ns

    @property
    def idle_mark_ns(self) -> int:
        """A worker that sent an owner no report for this long tells it it went idle (an
        empty batch, `Reporter._mark_idles`): four leases, so a sparse reporter hardly ever
        does, nor does one whose owner was just cut off."""
        return 4 * self.reporter_lease_ms * MS

    @property
    def floor_recent_ns(self) -> int:
        """A worker floors only a view whose snapshot came this recently before its owner's
        last word (the owner escrows those keys, `escrow_recent_ns`)."""
        return FLOOR_RECENT_LEASES * self.reporter_lease_ms * MS

    @property
    def escrow_recent_ns(self) -> int:
        """The owner escrows a silent worker's keys it sent a row of this recently before it
        last heard from the worker: `floor_recent_ns` plus the trip, a lost reply and a tick."""
        return self.floor_recent_ns + (self.snapshot_ttl_ms + self.sync_interval_ms) * MS

    @property
    def share_window_ns(self) -> int:
        """The owner remembers the largest share it sent each reporter per window this long,
        and for the window before (`_escrow.note_share`): two windows cover every row a
        worker may floor on (sent from `escrow_recent_ns` before its silence to its lease's
        end)."""
        return self.escrow_recent_ns + self.reporter_lease_ms * MS

    @property
    def escrow_tail_ns(self) -> int:
        """How long after its last batch to a silent worker the owner charges its escrow:
        the worker's floor ends `floor_wait_ns + floor_ns` after its own last word from the
        owner, which is that batch's arrival at the latest, a trip (a TTL) after it."""
        return self.floor_ns + self.floor_wait_ns + self.snapshot_ttl_ns

    @property
    def escrow_netting_ns(self) -> int:
        """How long after a silent worker is heard again its reports are netted against the
        escrow: its resends (report_retry_max) and the flush of what it held (a sync
        interval), with a TTL of slack for the trip."""
        return (self.report_retry_max_ms + 2 * self.sync_interval_ms + self.snapshot_ttl_ms) * MS

    @property
    def floor_window_ns(self) -> int:
        """The owner promises a member a floor of FLOOR_HEADROOM times its usage over this
        long before the row it sends (`shares.floor_demand_ppm`), and escrows that."""
        return FLOOR_WINDOW_LEASES * self.reporter_lease_ms * MS

    @property
    def floor_grain_ns(self) -> int:
        """The grain of the owner's `shares.UsageWindow`s: a quarter of the window."""
        return self.floor_window_ns // FLOOR_GRAINS

    @property
    def floor_grains(self) -> int:
        """Grains a `UsageWindow` keeps: those a window can touch, one more than it spans."""
        return FLOOR_GRAINS + 1

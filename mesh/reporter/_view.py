"""A worker's local view of one global RateKey (seed 004, "Bounding drift")."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from mesh.messages import PPM, RateSnapshot
from mesh.policy import RateKey, TenantRatePolicy
from mesh.view import View

__all__ = ["GlobalView", "ViewState", "Inflight"]


class ViewState(Enum):
    BOOT = "boot"  # no fresh snapshot and nothing unacknowledged: a small allowance
    FRESH = "fresh"  # a snapshot younger than the TTL
    STALE = "stale"  # the snapshot expired with usage unacknowledged: admit nothing new


class Inflight:
    """One sent, not yet acknowledged report: kept for retries with its sequence."""

    __slots__ = ("sequence", "delta", "denied", "sent_at_ns", "created_ns")

    def __init__(self, sequence: int, delta: int, denied: int, created_ns: int) -> None:
        self.sequence = sequence
        self.delta = delta
        self.denied = denied
        self.sent_at_ns = -1  # not sent yet
        self.created_ns = created_ns


_NO_INFLIGHT: list[Inflight] = []  # shared and never appended to: see Reporter.flush
_NO_SNAPSHOT = (-1, -1, -1)


class GlobalView(View):
    """avail = allowance - unacknowledged, where allowance comes from the last snapshot.

    Never `remaining` copied in: the local view subtracts what this worker consumed that the
    snapshot does not yet reflect (`inflight_sum + pending`).
    """

    __slots__ = ("key", "state", "allowance", "inflight", "inflight_sum", "next_sequence",
                 "snap_order", "fresh_until_ns", "boot_since_ns", "owner", "owner_ring_epoch")

    def __init__(self, policy: TenantRatePolicy, sink: Callable[[View], None]) -> None:
        super().__init__(policy, sink)
        self.key: RateKey = policy.rate_key
        self.state = ViewState.BOOT
        self.allowance = 0
        self.inflight: list[Inflight] = _NO_INFLIGHT  # a list of its own once a report is sent
        self.inflight_sum = 0
        self.next_sequence = 1
        self.snap_order: tuple[int, int, int] = _NO_SNAPSHOT
        self.fresh_until_ns = 0
        self.boot_since_ns = 0
        self.owner: str | None = None
        self.owner_ring_epoch = -1

    @property
    def had_snapshot(self) -> bool:
        return self.snap_order is not _NO_SNAPSHOT

    @property
    def unacked(self) -> int:
        return self.inflight_sum + self.pending

    def recompute(self) -> None:
        """avail from allowance and what is unacknowledged; 0 whenever stale."""
        self.avail = 0 if self.state is ViewState.STALE else self.allowance - self.unacked

    def ack(self, sequence: int) -> list[Inflight]:
        """Drop reports the owner has applied (contiguously) up to `sequence`."""
        n = 0
        for r in self.inflight:
            if r.sequence > sequence:
                break
            self.inflight_sum -= r.delta
            n += 1
        if not n:
            return []
        acked = self.inflight[:n]
        del self.inflight[:n]
        return acked

    def take_snapshot(self, snap: RateSnapshot, now_ns: int, ttl_ns: int) -> list[Inflight]:
        """Adopt a newer snapshot; returns the reports it acknowledged."""
        acked = self.ack(snap.ack_sequence_for_receiver)
        self.snap_order = snap.order
        b = self.policy.local_burst_cap
        # The local burst cap: b divided by the owner-observed active-worker count (seed
        # 004), or this worker's demand share of b when that is larger (load-balancer skew).
        even = -(-b // snap.active_reporters)
        by_demand = b * snap.share_ppm // PPM
        cap = even if even > by_demand else by_demand
        # This worker's part of what remains. With at least one unit per active worker,
        # each gets one whole unit first and shares the rest, so small remainders are not
        # rounded away; the parts of all active workers still sum to at most `remaining`.
        x, a = snap.remaining, snap.active_reporters
        portion = 1 + (x - a) * snap.share_ppm // PPM if x >= a else x * snap.share_ppm // PPM
        self.allowance = portion if portion < cap else cap
        self.fresh_until_ns = now_ns + ttl_ns
        self.state = ViewState.FRESH
        self.recompute()
        return acked

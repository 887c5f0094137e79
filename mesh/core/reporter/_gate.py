"""A worker's local view of one global RateKey (seed 004, "Bounding drift")."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from mesh.core.gate import Gate
from mesh.core.gcra import Gcra, refill_ns
from mesh.core.messages import above_applied
from mesh.core.policy import RateKey, TenantRatePolicy
from mesh.core.shares import PPM, share_round, snapshot_allowance_ppm
from mesh.core.verdict import Numbers, Verdict, ms_ceil

if TYPE_CHECKING:
    from mesh.core.admission import Admission

__all__ = ["GlobalGate", "SnapshotState", "Inflight"]


class SnapshotState(Enum):
    BOOT = "boot"  # no fresh snapshot and nothing unacknowledged: a small allowance
    FRESH = "fresh"  # a snapshot younger than the TTL
    STALE = "stale"  # the snapshot expired with usage unacknowledged: admit nothing new,
    # or, cut off from the owner, only from the view's floor (`GlobalGate.floor`)


class Inflight:
    """One sent, not yet acknowledged report: kept for retries with its sequence."""

    __slots__ = ("sequence", "delta", "denied", "sent_at_ns", "created_ns", "sends")

    def __init__(self, sequence: int, delta: int, denied: int, created_ns: int) -> None:
        self.sequence = sequence
        self.delta = delta
        self.denied = denied
        self.sent_at_ns = -1  # not sent yet
        self.created_ns = created_ns
        self.sends = 0


class AppliedNet:
    """One view's comparison of what its owner acknowledged with what the owner says it
    applied (`GlobalGate.note_applied`): the net delta of every report an ack dropped since
    this was made (sub-units), and, as of the last row that said `applied_net`, the (owner,
    owner_epoch, incarnation) whose record it counts, what the view then counted as taken
    (`acked + applied_above`), what the owner said it applied, and what is left unapplied."""

    __slots__ = ("acked", "source", "said", "applied", "unapplied")

    def __init__(self) -> None:
        self.acked = 0
        self.source: tuple[str, int, int] | None = None
        self.said = 0
        self.applied = 0
        self.unapplied = 0


_NO_INFLIGHT: list[Inflight] = []  # shared and never appended to: see Reporter.flush
_NO_SNAPSHOT = (-1, -1, -1)


class GlobalGate(Gate):
    """avail = allowance - unacknowledged, where allowance comes from the last snapshot
    (less what of the unacknowledged that snapshot already reflected: `applied_above`).

    Never `remaining` copied in: the local view subtracts what this worker consumed that the
    snapshot does not yet reflect (`inflight_sum + pending`).
    """

    __slots__ = (
        "key",
        "state",
        "allowance",
        "inflight",
        "inflight_sum",
        "next_sequence",
        "snap_order",
        "snap_remaining",
        "snap_active",
        "snap_at_ns",
        "fresh_until_ns",
        "boot_since_ns",
        "owner",
        "owner_ring_epoch",
        "resend_at_ns",
        "snap_from",
        "snap_incarnation",
        "snap_batch",
        "reported_at_ns",
        "snap_floor_ppm",
        "floor",
        "floor_ppm",
        "floor_mark",
        "floor_left",
        "applied_above",
        "want",
        "eager_until_ns",
        "net",
    )

    HOLDS_B_AT_MOST = True  # no view holds more than b (`snapshot_allowance_ppm`)

    def __init__(self, policy: TenantRatePolicy, sink: Callable[[Gate], None]) -> None:
        super().__init__(policy, sink)
        self.key: RateKey = policy.rate_key
        self.state = SnapshotState.BOOT
        self.allowance = 0
        self.inflight: list[Inflight] = _NO_INFLIGHT  # a list of its own once a report is sent
        self.inflight_sum = 0
        self.next_sequence = 1
        # (owner_epoch, owner incarnation, version) of the snapshot held: only ever compared
        # as a whole, with the next snapshot's (never step back to an older view).
        self.snap_order: tuple[int, int, int] = _NO_SNAPSHOT
        self.snap_remaining = 0
        self.snap_active = 1  # the owner's count of the key's active reporters, that row
        self.snap_at_ns = 0
        self.fresh_until_ns = 0
        self.boot_since_ns = 0
        self.owner: str | None = None
        self.resend_at_ns = -1  # when the reporter's resend queue next looks at this view
        self.owner_ring_epoch = -1
        # The owner whose snapshot the view holds, its incarnation, and the batch that
        # brought it: what its later batches may vouch for (Reporter.tick).
        self.snap_from = ""
        self.snap_incarnation = -1
        self.snap_batch = 0
        self.reported_at_ns = -1  # when a report of this key last went out (the owner's lease)
        # Serving through a partition (`Reporter._serve_floor`): a GCRA at R x `floor_ppm` over
        # time divided by 1e6 (floor_ppm of R per second), what it had left at its last settle,
        # and `unacked` then (what was admitted since is `unacked - floor_mark`).
        self.snap_floor_ppm = 0  # the floor (ppm) its owner promised in the row held
        self.floor: Gcra | None = None
        self.floor_ppm = 0
        self.floor_mark = 0
        self.floor_left = 0
        # Of `unacked`, what the snapshot held already reflects (reports past a gap in its
        # ack that its owner applied, `SnapshotBatch.applied_above`): not subtracted again.
        self.applied_above = 0
        # The largest amount (sub-units) denied here since the view was made, at most b
        # (the idle sweep forgets the view, and with it this): each snapshot's cap is at
        # least it (`snapshot_allowance_ppm`'s `need`), so an amount above this worker's
        # even part of b is served, not starved, and the view still never holds more than
        # b (the N*b of the envelope).
        self.want = 0
        # Until when each admission is reported at once (`Reporter._sink`), after an ask of
        # at most b was denied that is above the view's even part of b, or that its own
        # unreflected usage kept under b: -1 from the next flush (`EAGER_REPORTS_NS`), 0
        # never. A trickle of small asks keeps a unit or two in flight all the time;
        # reported at once, they are reflected within a round trip (and the owner hears the
        # demand that raises the view's cap), so the larger ask fits at its retry. A key
        # short of budget, denying asks within the even part, reports as usual.
        self.eager_until_ns = 0
        # Usage acknowledged but not applied (`note_applied`), for the excess estimate only;
        # made by the first row that says `applied_net` (a view no owner has answered pays
        # one slot), dropped when the view idles.
        self.net: AppliedNet | None = None

    @property
    def had_snapshot(self) -> bool:
        return self.snap_order is not _NO_SNAPSHOT

    @property
    def unacked(self) -> int:
        """In sub-units, as the owner counts (`Gate`: `pending` is in units)."""
        return self.inflight_sum + self.pending * self.scale

    def recompute(self) -> None:
        """avail from allowance and what is unacknowledged; when stale, what the floor has
        left (0 without one)."""
        if self.state is not SnapshotState.STALE:
            # Usage not yet reflected in the allowance's snapshot is subtracted; a net
            # refund not yet applied by the owner adds nothing (the snapshot's bucket may
            # have been full: its refill already covers it), until a snapshot shows it.
            ahead = self.unacked - self.applied_above
            self.avail = (self.allowance - (ahead if ahead > 0 else 0)) // self.scale
        elif self.floor is None:
            self.avail = 0
        else:
            self.avail = (self.floor_left - (self.unacked - self.floor_mark)) // self.scale

    def numbers(self, amount: int, allowed: bool, now_ns: int) -> Numbers:
        """`remaining` is `avail`. `retry_after_ms`, denied: the earliest the owner's bucket
        can have refilled what this view lacks for `amount` at R (other workers may take it
        first, so a retry then may be denied again); from a floor, the floor's own GCRA wait.
        `reset_after_ms`: with a fresh snapshot, until the owner's bucket is full again as
        that snapshot showed it, less what this worker used that it does not reflect,
        refilled at R since (others' use since is not seen here); otherwise None."""
        p = self.policy
        remaining = max(self.avail, 0)
        scale = self.scale
        reset = None
        if self.state is SnapshotState.FRESH:
            held = self.snap_remaining - (self.unacked - self.applied_above)
            reset = ms_ceil(
                refill_ns(p.global_burst - held, p.target_rate) - (now_ns - self.snap_at_ns)
            )
        retry: int | None = 0
        if allowed:
            pass
        elif self.state is SnapshotState.STALE and self.floor is not None:
            f = self.floor.copy()
            at = now_ns // PPM  # the floor's time unit (settle_floor)
            if self.unacked > self.floor_mark:
                f.apply(at, self.unacked - self.floor_mark)
            need = amount * scale
            retry = None if need > f.burst else max(1, ms_ceil(f.wait_ns(at, need) * PPM))
        else:
            retry = max(1, ms_ceil(refill_ns((amount - remaining) * scale, p.target_rate)))
        return Numbers(remaining, retry, reset)

    def wanted(self, amount: int) -> None:
        """A denial of `amount` units here: counted for the owner (demand), remembered as
        the least the next snapshot's cap must let this view hold (`want`, at most b), and,
        for an ask the cap or in-flight usage kept out, reported eagerly for a while."""
        self.denied += amount
        need = amount * self.scale
        cap = self.policy.local_burst_cap
        if need > self.want:
            self.want = need if need < cap else cap
        if need <= cap and (
            need * self.snap_active > cap or need + self.unacked - self.applied_above > cap
        ):
            self.eager_until_ns = -1  # from the next flush (`Reporter.flush`)
        if not self.marked:
            self.sink(self)

    def grant(self, amount: int) -> bool:
        """On the deny path (`amount` > `avail`): True if the ask is taken after all (else
        the caller calls `wanted`: the next snapshots' cap makes room for it).

        Taken when the owner's bucket, as the last snapshot showed it, holds it for every
        active reporter at once: what this view took since that snapshot plus the ask (at
        most b), times the n reporters, is at most what remained. Were all n to do the same,
        the fleet would take no more than remained, as with the allowance's even split, and
        each view holds at most b unreflected (the envelope's N*b); yet an ask above the
        allowance's cap (b/n), or one that a trickle of smaller asks keeps just above what
        the view has left, is served while the bucket has room instead of waiting for a
        snapshot that the trickle may keep from ever fitting it."""
        if self.state is SnapshotState.FRESH:
            b = self.policy.local_burst_cap
            ahead = self.unacked - self.applied_above
            if ahead < 0:
                ahead = 0
            took = ahead + amount * self.scale
            if took <= b and took * self.snap_active <= self.snap_remaining:
                if took > self.allowance:
                    self.allowance = took
                self.pending += amount
                self.recompute()
                if self.pending >= self.flush_at:
                    self.sink(self)
                return True
        return False

    def settle_floor(self, now_ns: int) -> None:
        """Charge the floor with what was admitted since its last settle (as of now: that
        only ever tightens it) and take what it has left."""
        floor = self.floor
        assert floor is not None
        at = now_ns // PPM
        used = self.unacked - self.floor_mark
        if used > 0:
            floor.apply(at, used)
        self.floor_mark = self.unacked
        self.floor_left = floor.remaining(at)
        self.recompute()

    def ack(self, sequence: int) -> list[Inflight]:
        """Drop reports the owner has applied (contiguously) up to `sequence`."""
        n = dropped = 0
        for r in self.inflight:
            if r.sequence > sequence:
                break
            dropped += r.delta
            n += 1
        if not n:
            return []
        self.inflight_sum -= dropped
        if self.net is not None:
            self.net.acked += dropped
        acked = self.inflight[:n]
        del self.inflight[:n]
        return acked

    def note_applied(self, source: tuple[str, int, int], applied_net: int) -> None:
        """Compare what the owner says it applied of our reports (`applied_net`, the net of
        its record of us) with what its acknowledgements covered: what it acknowledged
        and did not apply since the last row grows `unapplied` (and what it applied beyond
        shrinks it, never below 0). Per snapshot, never on the admission path.

        Only steps within one record count. A row from another owner, owner epoch or
        incarnation, or the first after the view went idle, starts the comparison afresh;
        so does a row whose count fell by more than ours did (the owner forgot our record
        and began another: usage is never un-applied, a refund falls on both sides)."""
        net = self.net
        if net is None:
            net = self.net = AppliedNet()
        said = net.acked + self.applied_above
        if source == net.source:
            net_step = applied_net - net.applied
            step = (said - net.said) - net_step
            if not (net_step < 0 and step > 0):
                left = net.unapplied + step
                net.unapplied = left if left > 0 else 0
        else:
            net.source = source
        net.said = said
        net.applied = applied_net

    @property
    def unapplied(self) -> int:
        """Sub-units the owner acknowledged and did not apply (`note_applied`)."""
        return 0 if self.net is None else self.net.unapplied

    @property
    def net_from(self) -> tuple[str, int, int] | None:
        """The (owner, owner_epoch, incarnation) whose record `unapplied` counts."""
        return None if self.net is None else self.net.source

    def take_snapshot(
        self,
        order: tuple[int, int, int],
        remaining: int,
        ack: int,
        share_ppm: int,
        active_reporters: int,
        now_ns: int,
        ttl_ns: int,
        coin_ppm: int,
        above_mask: int = 0,
    ) -> list[Inflight]:
        """Adopt a newer snapshot (one row of a SnapshotBatch); returns the reports it
        acknowledged.

        allowance = min(this worker's share of `remaining`, its local burst cap), where the
        cap is b divided by the owner-observed active-worker count (seed 004), or, for a
        share above the even one (load-balancer skew), b x (2 x share - 1/n), at most b
        (`shares.allowance_cap_ppm`). The owner's shares sum to one, so the fleet's
        allowances sum to about `remaining`.
        `above_mask` says which reports past the gap after `ack` `remaining` reflects
        (`SnapshotBatch.applied_above`): their usage stays unacknowledged (they are resent
        until the gap is filled) but is not subtracted from this allowance again.
        """
        acked = self.ack(ack)
        self.applied_above = (
            sum(r.delta for r in self.inflight if above_applied(above_mask, ack, r.sequence))
            if above_mask
            else 0
        )
        self.snap_order = order
        self.snap_remaining = remaining
        self.snap_active = active_reporters if active_reporters > 0 else 1
        self.snap_at_ns = now_ns
        self.allowance = share_round(
            snapshot_allowance_ppm(
                remaining, share_ppm, active_reporters, self.policy.local_burst_cap, self.want
            ),
            coin_ppm,
        )
        self.fresh_until_ns = now_ns + ttl_ns
        self.state = SnapshotState.FRESH
        self.floor = None  # the owner answers again: no floor
        self.recompute()
        return acked

    # ---- what admission asks of the view (`Gate`) -----------------------------------------

    def deny(self, amount: int, admission: Admission) -> Verdict:
        """Taken after all if the last snapshot has room for it for every active reporter
        at once (`grant`); else denied, and the owner hears of the demand (`wanted`)."""
        if self.grant(amount):
            return self.ok
        self.wanted(amount)
        return self.no

    def refund(self, amount: int) -> None:
        """The correction reaches the owner in a later report, as a smaller (possibly
        negative) delta."""
        self.pending -= amount
        self.recompute()
        if not self.marked:
            self.sink(self)

    def idle(self, admission: Admission) -> bool:
        """Everything acknowledged and no fresh snapshot: the reporter drops it too."""
        reporter = admission.reporter
        return reporter is not None and reporter.forget_if_idle(self.key)

    def forget(self, admission: Admission, *, retire: bool) -> None:
        """A new generation: the old key keeps reporting until it drains."""
        if retire and admission.reporter is not None:
            admission.reporter.retire(self.key)

    def health(self) -> dict[str, object]:
        return {"view": self.state.value}

"""Escrow for silent reporters: the owner's half of serving through partitions.

A worker cut off from a key's owner keeps admitting from its floor for at most
`partition_floor_ms` (`mesh.core.reporter`): the part of R per second the owner promised it in
the last row of the key it received (`promise`: the least of its share, 1 / ring members and
`shares.FLOOR_HEADROOM` times what the owner applied from it lately, none if it was refused
as much), opening `floor_wait_ns` after its floor's wait began. The owner cannot hear that
usage, so it charges the key's meter for it in advance.

Both sides count from one moment, the start of the worker's floor wait (its last word from
the owner, or its oldest unacknowledged report if newer), and the owner measures it on its
own clock from below (`anchor`): the send time of the newest of its batches the worker
confirmed having received (`ReportBatch.heard_batch`), and a report's arrival less how long
before its sending that wait began (`ReportBatch.since_ages`). Lost answers, reconnecting
resends and cuts that follow heals move neither. When that moment is `escrow_after_ns` old
and the owner had sent the worker a row of the key shortly before it, the owner charges the
largest part it promised the worker lately (and any larger one it promises later), from that
moment until `escrow_tail_ns` after its last batch to the worker, which is after the
worker's floor can end. What the worker reports when it is heard again is netted against
what was charged: only the usage beyond the escrow is applied. docs/partitions.md states why
the envelope holds.

Escrows are settled lazily, when something reads the key's meter (`settle`): the owner
charges what is owed up to now before it tells anyone what remains, which is the same as
charging continuously. Per key there is at most one escrow per reporter record, so the map
is bounded by `reporters_per_key_max`; a record is dropped once its netting window closed,
its span ran out long ago, or its member left the ring.
"""

from __future__ import annotations

from collections import deque

from mesh.core.config import CoreConfig
from mesh.core.owner._state import KeyState, ReporterState
from mesh.core.ring import Ring
from mesh.core.shares import FLOOR_HEADROOM, PPM, UsageWindow, floor_units

__all__ = ["Escrow", "Escrows", "HEARD_MAX", "MARKS_MAX"]

# Workers an owner keeps a `_Peer` for: members of its ring (and those that left within the
# hand-over grace) are what it writes to, so this is far above any real fleet; beyond it
# the longest-silent half is dropped (they only lose their escrow).
HEARD_MAX = 65_536
# Batches to one worker whose send time an owner remembers until the worker confirms one at
# or past them: a few per sync interval over a round trip when it answers, its lease's
# worth when it does not. Past it newer batches go unmarked, and a confirmation of one
# counts from the newest mark before it (earlier: it only escrows sooner).
MARKS_MAX = 32


class _Peer:
    """What an owner knows of one worker's last word from it, on the owner's own clock."""

    __slots__ = (
        "marks",
        "last_seq",
        "first_sent",
        "last_sent",
        "confirmed_at",
        "resumed_at",
        "moved_at",
        "idle_at",
        "reported_at",
        "idle",
        "heard",
    )

    def __init__(self) -> None:
        self.marks: deque[tuple[int, int]] = deque()  # (batch_seq, built at), unconfirmed
        self.last_seq = -1  # the number of the last batch to it
        self.first_sent = -1  # the first batch to it: it heard nothing of ours before
        self.last_sent = -1  # the last batch to it: it heard nothing of ours after
        self.confirmed_at = -1  # the newest batch it confirmed having received, built at
        self.resumed_at = -1  # its first report after its last idle mark arrived then
        self.moved_at = -1  # when the anchor last moved (the batch that moved it arrived)
        self.idle_at = -1  # when its last idle mark arrived
        self.reported_at = -1  # when its last report batch arrived
        self.idle = False  # its last batch was an idle mark: it floors nothing
        # `heard_from()`, kept as its inputs change (`_heard`): every reporter of every key
        # the member reports reads it when its key's live count is taken (`Escrows.check`).
        self.heard = -1

    def heard_from(self) -> int:
        """The earliest its last word from us can be: the newest batch it confirmed, its
        first report after an idle mark (it floors only once such a report is answered),
        and never before our first batch to it."""
        a = self.confirmed_at if self.confirmed_at > self.resumed_at else self.resumed_at
        return a if a > self.first_sent else self.first_sent

    def _heard(self) -> None:
        """Keep `heard` current: call after `confirmed_at`, `resumed_at` or `first_sent` moved."""
        self.heard = self.heard_from()


class Escrow:
    """What an owner charged one key for one silent reporter's floor."""

    __slots__ = ("from_ns", "until_ns", "part_ppm", "charged", "netted", "back_ns")

    def __init__(self, from_ns: int, until_ns: int, part_ppm: int) -> None:
        self.from_ns = from_ns  # its floor's wait began no earlier (the anchor)
        self.until_ns = until_ns  # charging stops here (`CoreConfig.escrow_tail_ns`)
        self.part_ppm = part_ppm  # the floor escrowed: this part (ppm) of R per second
        self.charged = 0  # units charged to the key's meter so far
        self.netted = 0  # units of the worker's reports absorbed by `charged`
        self.back_ns = -1  # when the worker was heard again (-1: still silent)

    def __repr__(self) -> str:
        return (
            f"Escrow(from_ns={self.from_ns}, until_ns={self.until_ns}, part_ppm={self.part_ppm}, "
            f"charged={self.charged}, netted={self.netted}, back_ns={self.back_ns})"
        )


class Escrows:
    """The owner's escrow bookkeeping: what each worker last heard from it, and the rules
    that open, charge, net and close a key's escrows."""

    def __init__(self, config: CoreConfig, members: int, me: str) -> None:
        self.config = config
        self.me = me  # this member reports to itself over no network: it is never cut off
        self.peers: dict[str, _Peer] = {}
        # The floor's cap is R / members: the smaller of the ring's size now and before its
        # last change, so a worker that has not yet seen a join (a larger cap) is covered.
        self.members = max(1, members)
        self._grain_ns = config.floor_grain_ns  # of the usage windows (`note_used`)
        self._grains = config.floor_grains
        # CoreConfig's derived spans, read on the reply path: computed once (it is frozen).
        self._window_ns = config.floor_window_ns
        self._share_window_ns = config.share_window_ns
        self._recent_ns = config.escrow_recent_ns
        self._after_ns = config.escrow_after_ns
        self._tail_ns = config.escrow_tail_ns
        self._ttl_ns = config.snapshot_ttl_ns
        # floor_demand_ppm's FLOOR_HEADROOM x used x PPM / (window x rate), its constant part
        self._demand_scale = FLOOR_HEADROOM * PPM * 1_000_000_000
        # What `promise` derives from the time alone, for the instant `_at` (every row of a
        # batch is sent at one instant, so once a batch, not once a row).
        self._at = -1
        self._at_grain = self._at_first = self._at_win = 0
        self.charged_units = 0  # telemetry: escrow charged, all keys
        self.netted_units = 0  # telemetry: reported usage absorbed by it
        self.refunded_units = 0  # telemetry: charged, never reported, given back at close

    def on(self) -> bool:
        return self.config.partition_floor_ms > 0

    def anchor(self, p: _Peer) -> int:
        """Where an escrow for this worker may start: a TTL after the earliest its last word
        from us can be (its floor opens `escrow_after_ns` and a TTL after that word, holding
        only what the escrow charged over `escrow_after_ns`: docs/partitions.md)."""
        a = p.heard
        return a + self._ttl_ns if a >= 0 else -1

    def row_slack(self) -> int:
        """What a report's arrival less its `since_ages` may be moved on by and stay no later
        than a TTL after its view's floor wait began: the rest of a TTL after a trip, which
        is at most half of what a TTL leaves of a sync interval (`CoreConfig`)."""
        cfg = self.config
        return (cfg.snapshot_ttl_ns - cfg.sync_interval_ns) // 2

    def _peer(self, worker: str) -> _Peer:
        p = self.peers.get(worker)
        if p is None:
            peers = self.peers
            if len(peers) >= HEARD_MAX:
                for w in sorted(peers, key=lambda w: (peers[w].last_sent, w))[: HEARD_MAX // 2]:
                    del peers[w]
            p = peers[worker] = _Peer()
        return p

    def sent(self, worker: str, batch_seq: int, now_ns: int) -> None:
        """A batch numbered `batch_seq` to `worker` was built now."""
        p = self._peer(worker)
        if p.first_sent < 0:
            p.first_sent = now_ns
            p._heard()
        p.last_sent = now_ns
        p.last_seq = batch_seq
        if len(p.marks) < MARKS_MAX:
            p.marks.append((batch_seq, now_ns))

    def heard_from(self, worker: str, now_ns: int, heard_batch: int) -> None:
        """A report batch from `worker` arrived, saying it received our `heard_batch`."""
        p = self._peer(worker)
        before = p.heard
        self._confirm(p, heard_batch)
        p.reported_at = now_ns
        if p.idle:
            p.idle = False
            p.resumed_at = now_ns
        p._heard()
        if p.heard > before:
            p.moved_at = now_ns

    def idle_mark(self, worker: str, now_ns: int, heard_batch: int) -> None:
        """`worker` says it went idle (it sent no report for `idle_mark_ns`): it closed its
        floors when it sent this and opens none until a later report is answered. Ignored
        within a TTL of its last report: a mark overtaken by a later report (reordering)
        must not turn off an escrow its sender counts on."""
        p = self._peer(worker)
        before = p.heard
        self._confirm(p, heard_batch)
        p._heard()
        if p.heard > before:
            p.moved_at = now_ns
        if p.reported_at < 0 or now_ns - p.reported_at <= self.config.snapshot_ttl_ns:
            return
        p.idle = True
        p.idle_at = now_ns

    @staticmethod
    def _confirm(p: _Peer, heard_batch: int) -> None:
        """The worker received our batch `heard_batch`: it heard us no earlier than when the
        newest marked batch up to it was built. A number we never sent is not believed."""
        marks = p.marks
        if not marks or heard_batch < marks[0][0] or heard_batch > p.last_seq:
            return
        at = -1
        while marks and marks[0][0] <= heard_batch:
            at = marks.popleft()[1]
        if at > p.confirmed_at:
            p.confirmed_at = at

    def forget(self, worker: str) -> None:
        """We have not written to `worker` for the idempotency retention: any floor of it
        ended long ago."""
        self.peers.pop(worker, None)

    @property
    def members(self) -> int:
        return self._members

    @members.setter
    def members(self, n: int) -> None:
        self._members = n
        self._even_ppm = PPM // n  # floor_ppm's cap, 1 / members, read once per row sent

    def ring_changed(self, old: Ring, new: Ring) -> None:
        self.members = max(1, min(len(old), len(new)))
        for w in [w for w in self.peers if w not in new]:
            del self.peers[w]

    def check(self, now_ns: int, ks: KeyState, worker: str, rs: ReporterState) -> int:
        """A reporter of `ks`: open its escrow if its floor's wait may have begun
        `escrow_after_ns` ago and it was sent a row of the key shortly before. Returns when
        to look again (when it may have), or -1."""
        p = self.peers.get(worker)
        if p is None or p.idle or worker == self.me:
            return -1
        anchor = p.heard + self._ttl_ns if p.heard >= 0 else -1  # self.anchor(p)
        if rs.row_anchor > anchor:
            anchor = rs.row_anchor
        if anchor < 0 or rs.sent_at_ns < anchor - self._recent_ns:
            return -1  # it held no recent row of this key: it floors nothing of it
        silent_at = anchor + self._after_ns
        if silent_at >= now_ns:
            return silent_at + 1  # heard from lately: look again when it may not have been
        escrows = ks.escrow
        if escrows is None:
            escrows = ks.escrow = {}
        e = escrows.get(worker)
        if e is None or (e.back_ns >= 0 and e.from_ns != anchor):  # one charging covers it
            # Whichever row it holds, it promised no more than the largest part sent to it
            # over the two windows (and `promise` raises the escrow for any sent later).
            part = rs.share_cur if rs.share_cur > rs.share_prev else rs.share_prev
            if part > 0:
                escrows[worker] = Escrow(anchor, p.last_sent + self._tail_ns, part)
        return -1

    def promise(self, ks: KeyState, rs: ReporterState, worker: str, share: int, now: int) -> int:
        """The floor (ppm of R per second) promised to `worker` in a row of `ks` sent now,
        should it be cut off: the least of its `share`, 1 / members and the demand part of
        what we applied from it over `floor_window_ns` before now (none if it was refused as
        much). Noted for its escrow; an escrow charging for it is raised to it."""
        if now != self._at:
            self._instant(now)
        grain = self._at_grain
        used, denied = rs.floor_used, rs.floor_denied
        if rs.demand_grain != grain:
            # Once a grain: the window's grains before this one are complete, so their sums
            # hold until the next grain (the window is whole grains: CoreConfig).
            first = self._at_first
            rs.demand_used_base = 0 if used is None else used.before(first, grain)
            rs.demand_denied_base = 0 if denied is None else denied.before(first, grain)
            rs.demand_grain = grain
        units, refused = rs.demand_used_base, rs.demand_denied_base
        if used is not None and used.newest == grain:
            units += used.counts[grain % self._grains]
        if denied is not None and denied.newest == grain:
            refused += denied.counts[grain % self._grains]
        # floor_ppm(share, members, floor_demand_ppm(rate, units, refused, window)), inlined
        # (once per row sent); test_partition_floor pins it to the two on random rows.
        part = self._even_ppm
        if share < part:
            part = share
        if units <= 0 or refused >= units:
            part = 0
        elif part:
            demand = units * self._demand_scale // (self._window_ns * ks.policy.target_rate)
            if demand < part:
                part = demand
        win = self._at_win
        if win != rs.share_win:
            rs.share_prev = rs.share_cur if win == rs.share_win + 1 else 0
            rs.share_cur = 0
            rs.share_win = win
        if part > rs.share_cur:
            rs.share_cur = part
        e = ks.escrow.get(worker) if ks.escrow else None
        if e is not None and e.back_ns < 0 and part > e.part_ppm:
            e.part_ppm = part  # charged from its start at the larger part (`settle`)
        return part

    def _instant(self, now: int) -> None:
        """`promise`'s grain, window start and share window for rows sent at `now`."""
        self._at = now
        self._at_grain = now // self._grain_ns
        self._at_first = (now - self._window_ns) // self._grain_ns
        self._at_win = now // self._share_window_ns

    def grain(self, now_ns: int) -> int:
        """The usage windows' grain (`CoreConfig.floor_grain_ns`) holding `now_ns`."""
        return now_ns // self._grain_ns

    def note_used(self, rs: ReporterState, units: int, denied: int, grain: int) -> None:
        """A report of `units` used and `denied` refused from this reporter was applied,
        arriving in `grain` (of a report found implausible, only its denials: its claim
        makes no floor, docs/partitions.md). On the reply path of every report: the common
        case (usage only, in the grain of the reporter's last report) adds in place."""
        if units > 0:
            used = rs.floor_used
            if used is None:
                used = rs.floor_used = UsageWindow(self._grains)
            if used.newest == grain:
                used.counts[grain % self._grains] += units
            else:
                used.note(grain, units)
        if denied > 0:
            refused = rs.floor_denied
            if refused is None:
                refused = rs.floor_denied = UsageWindow(self._grains)
            refused.note(grain, denied)

    def settle(self, now_ns: int, ks: KeyState, ring: Ring) -> None:
        """Charge the key's meter what its escrows owe up to now; stop charging for a worker
        whose floor ended; drop escrows whose netting window closed or whose member left."""
        escrows = ks.escrow
        if not escrows:
            ks.escrow = None
            return
        cfg = self.config
        rate = ks.policy.target_rate
        for worker in list(escrows):
            e = escrows[worker]
            if worker not in ring:
                del escrows[worker]  # it left the ring: no floor of ours to cover
                continue
            p = self.peers.get(worker)
            if e.back_ns < 0 and p is not None:
                # Its floor's wait began after this escrow's (it heard a newer batch of ours,
                # or its reports say so: its floor ended first), or it went idle (its floor
                # ended when it said so): charging stops when that arrived. A move to a
                # moment already `escrow_after_ns` old when it arrived (a resend after a
                # cut, a late confirmation) says it may be on a floor from that moment now:
                # this escrow, from earlier, covers that one too.
                rs = ks.reporters.get(worker)
                quiet = cfg.escrow_after_ns
                anchor = self.anchor(p)
                if anchor > e.from_ns and p.moved_at - anchor <= quiet:
                    e.back_ns = p.moved_at
                elif (
                    rs is not None
                    and rs.row_anchor > e.from_ns
                    and (rs.row_moved_at - rs.row_anchor <= quiet)
                ):
                    e.back_ns = rs.row_moved_at
                elif p.idle and p.idle_at > e.from_ns:
                    e.back_ns = p.idle_at
                elif p.last_sent + cfg.escrow_tail_ns > e.until_ns:
                    e.until_ns = p.last_sent + cfg.escrow_tail_ns  # more batches to it since
            end = now_ns if now_ns < e.until_ns else e.until_ns
            if 0 <= e.back_ns < end:
                end = e.back_ns
            owed = floor_units(rate, end - e.from_ns, e.part_ppm) - e.charged
            if owed > 0:
                ks.meter.apply(now_ns, owed)
                e.charged += owed
                self.charged_units += owed
            closes = (
                e.back_ns + cfg.escrow_netting_ns
                if e.back_ns >= 0
                else e.until_ns + cfg.idempotency_retention_ms * 1_000_000
            )
            if now_ns > closes or (e.back_ns >= 0 and e.netted >= e.charged):
                unused = e.charged - e.netted
                if e.back_ns >= 0 and unused > 0:
                    # Heard again (or idle) and its reports since netted less than was
                    # charged: the floor was not spent in full, and what it did spend has
                    # been reported. The rest goes back to the key (never past full), so
                    # a pause or a late stream costs the others nothing in the end.
                    ks.meter.apply(now_ns, -unused)
                    self.refunded_units += unused
                del escrows[worker]
        if not escrows:
            ks.escrow = None

    def room(self, now_ns: int, ks: KeyState, worker: str, ring: Ring) -> int:
        """Units of a report from `worker` that its escrow on `ks` can absorb now."""
        self.settle(now_ns, ks, ring)
        e = ks.escrow.get(worker) if ks.escrow else None
        return 0 if e is None else e.charged - e.netted

    def absorb(self, ks: KeyState, worker: str, units: int) -> None:
        """Net `units` of the worker's report against its escrow (after `room`)."""
        assert ks.escrow is not None
        ks.escrow[worker].netted += units
        self.netted_units += units

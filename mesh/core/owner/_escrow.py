"""Escrow for silent reporters: the owner's half of serving through partitions (issue 12).

A worker cut off from a key's owner keeps admitting from its floor (`shares.floor_ppm` of R
per second: the least of its share in the owner's last row, 1 / ring members and
`shares.FLOOR_HEADROOM` times the usage it knows this owner applied from it lately, none if
it was refused as much) for at most `partition_floor_ms` (`mesh.core.reporter`). The owner
cannot hear that usage, so it charges the key's meter for it in advance: when a member it
sent a row of the key to recently (`CoreConfig.escrow_recent_ns`) has been silent for
`escrow_after_ns`, the owner charges the least of the largest share it sent it lately,
1 / ring members and the same demand part of what it applied from it over
`floor_window_ns` (`note_used`), from the moment it last heard from that member, for
`escrow_span_ns`, which ends after the worker's floor can. What the worker reports when it
is heard again is netted against what was charged: only the usage beyond the escrow is
applied. docs/partitions.md states why the envelope still holds.

Escrows are settled lazily, when something reads the key's meter (`settle`): the owner
charges what is owed up to now before it tells anyone what remains, which is the same as
charging continuously. Per key there is at most one escrow per reporter record, so the map
is bounded by `reporters_per_key_max`; a record is dropped once its netting window closed,
its span ran out long ago, or its member left the ring.
"""

from __future__ import annotations

from mesh.core.config import CoreConfig
from mesh.core.owner._state import KeyState, ReporterState
from mesh.core.ring import Ring
from mesh.core.shares import UsageWindow, floor_demand_ppm, floor_ppm, floor_units

__all__ = ["Escrow", "Escrows", "HEARD_MAX"]

# Workers whose last batch time an owner keeps (`Escrows.heard`): members of its ring (and
# those that left within the hand-over grace) are what report, so this is far above any
# real fleet; beyond it the oldest half is dropped (they only lose their escrow).
HEARD_MAX = 65_536


class Escrow:
    """What an owner charged one key for one silent reporter's floor."""

    __slots__ = ("from_ns", "until_ns", "part_ppm", "charged", "netted", "back_ns")

    def __init__(self, from_ns: int, until_ns: int, part_ppm: int) -> None:
        self.from_ns = from_ns  # when the owner last heard from the worker
        self.until_ns = until_ns  # charging stops here (`CoreConfig.escrow_span_ns`)
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
    """The owner's escrow bookkeeping: when it last heard from each worker, and the rules
    that open, charge, net and close a key's escrows."""

    def __init__(self, config: CoreConfig, members: int, me: str) -> None:
        self.config = config
        self.me = me  # this member reports to itself over no network: it is never cut off
        self.heard: dict[str, int] = {}  # worker -> when its last batch arrived
        # Workers whose last word was an idle mark (`idle_mark`): they floor nothing until a
        # later report of theirs is acknowledged, so they get no escrow.
        self.idle: set[str] = set()
        self._reported: dict[str, int] = {}  # worker -> when its last report batch arrived
        # The floor's cap is R / members: the smaller of the ring's size now and before its
        # last change, so a worker that has not yet seen a join (a larger cap) is covered.
        self.members = max(1, members)
        self._grain_ns = config.floor_grain_ns  # of the usage windows (`note_used`)
        self._grains = config.floor_grains
        self.charged_units = 0  # telemetry: escrow charged, all keys
        self.netted_units = 0  # telemetry: reported usage absorbed by it

    def on(self) -> bool:
        return self.config.partition_floor_ms > 0

    def heard_from(self, worker: str, now_ns: int) -> None:
        """A report batch from `worker` arrived."""
        heard = self.heard
        if worker not in heard and len(heard) >= HEARD_MAX:
            for w in sorted(heard, key=lambda w: (heard[w], w))[: HEARD_MAX // 2]:
                self._drop(w)
        heard[worker] = now_ns
        self._reported[worker] = now_ns
        if worker in self.idle:
            self.idle.discard(worker)

    def idle_mark(self, worker: str, now_ns: int) -> None:
        """`worker` says it went idle (it sent no report for `idle_mark_ns`). Ignored within
        a TTL of its last report: a mark overtaken by a later report (reordering) must not
        turn off an escrow its sender counts on."""
        last = self._reported.get(worker)
        if last is None or now_ns - last <= self.config.snapshot_ttl_ns:
            return
        self.heard[worker] = now_ns  # alive: a running escrow stops charging
        self.idle.add(worker)

    def _drop(self, worker: str) -> None:
        self.heard.pop(worker, None)
        self._reported.pop(worker, None)
        self.idle.discard(worker)

    def ring_changed(self, old: Ring, new: Ring) -> None:
        self.members = max(1, min(len(old), len(new)))
        for w in [w for w in self.heard if w not in new]:
            self._drop(w)

    def check(self, now_ns: int, ks: KeyState, worker: str, rs: ReporterState) -> int:
        """A reporter of `ks`: open its escrow if its member went silent (no batch for
        `escrow_after_ns`) and was sent a row of the key recently. Returns when to look
        again (when the member would have been silent that long), or -1."""
        heard = self.heard.get(worker)
        if heard is None or worker == self.me or worker in self.idle:
            return -1
        cfg = self.config
        if rs.sent_at_ns < heard - cfg.escrow_recent_ns:
            return -1  # it held no recent row of this key: it floors nothing of it
        silent_at = heard + cfg.escrow_after_ns
        if silent_at >= now_ns:
            return silent_at + 1  # heard lately: look again when it would be silent
        escrows = ks.escrow
        if escrows is None:
            escrows = ks.escrow = {}
        e = escrows.get(worker)
        if e is None or e.from_ns != heard:
            # Whichever row it holds, its floor is no more than the largest share sent to it
            # lately, and its demand part no more than ours: it counts no more usage than we
            # applied from it over the window before `heard`, and no fewer denials.
            share = rs.share_cur if rs.share_cur > rs.share_prev else rs.share_prev
            window = cfg.floor_window_ns
            first = (heard - window) // cfg.floor_grain_ns
            used, denied = rs.floor_used, rs.floor_denied
            units = 0 if used is None else used.since(first)
            refused = 0 if denied is None else denied.since(first)
            demand = floor_demand_ppm(ks.policy.target_rate, units, refused, window)
            part = floor_ppm(share, self.members, demand)
            if part > 0:
                escrows[worker] = Escrow(heard, heard + cfg.escrow_span_ns, part)
        return -1

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

    def note_share(self, rs: ReporterState, share_ppm: int, now_ns: int) -> None:
        """Remember a share sent to a reporter: the largest per window of `share_window_ns`,
        for this window and the one before, which cover every row a worker may floor on."""
        win = now_ns // self.config.share_window_ns
        if win != rs.share_win:
            rs.share_prev = rs.share_cur if win == rs.share_win + 1 else 0
            rs.share_cur = 0
            rs.share_win = win
        if share_ppm > rs.share_cur:
            rs.share_cur = share_ppm

    def settle(self, now_ns: int, ks: KeyState, ring: Ring) -> None:
        """Charge the key's meter what its escrows owe up to now; stop charging a worker
        heard again; drop escrows whose netting window closed or whose member left."""
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
            if e.back_ns < 0:
                heard = self.heard.get(worker, e.from_ns)
                if heard > e.from_ns:
                    e.back_ns = heard
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

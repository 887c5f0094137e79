"""Per-key and per-reporter state an owner keeps, with the idempotent apply rule."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.core._validate import INT_MAX
from mesh.core.gcra import Gcra
from mesh.core.policy import TenantRatePolicy

if TYPE_CHECKING:
    from mesh.core.owner._escrow import Escrow
    from mesh.core.shares import UsageWindow

__all__ = ["ReporterState", "KeyState", "Applied"]


class Applied:
    """Outcomes of offering one report to a ReporterState (ints: cheap, comparable)."""

    NEW = 0  # applied now
    DUPLICATE = 1  # already applied (or from an older incarnation): changes nothing
    TOO_FAR = 2  # beyond the reorder window: not applied, not acked; the worker retries


class ReporterState:
    """What an owner remembers of one worker incarnation's reports for one key.

    Sequences up to `watermark` are applied and acknowledged; `above` holds applied
    sequences past a gap (reordering), so a retry of any of them is recognised.
    """

    __slots__ = (
        "worker_epoch",
        "watermark",
        "above",
        "lease_until_ns",
        "last_seen_ns",
        "demand_cur",
        "demand_prev",
        "sent_at_ns",
        "seen_changes",
        "sent_allowance_ppm",
        "sent_floor",
        "window",
        "claim_tat",
        "net",
        "share_cur",
        "share_prev",
        "share_win",
        "handed_until_ns",
        "floor_used",
        "floor_denied",
        "row_anchor",
        "row_moved_at",
        "demand_grain",
        "demand_used_base",
        "demand_denied_base",
    )

    def __init__(self, worker_epoch: int, unacked_from: int, now_ns: int) -> None:
        self.worker_epoch = worker_epoch
        # A record starts at the worker's lowest unacknowledged sequence: everything below
        # was applied by some owner (this one before it forgot, or an earlier one).
        self.watermark = unacked_from - 1
        self.above: set[int] = set()
        self.lease_until_ns = 0
        self.last_seen_ns = now_ns
        # Demand (used + denied) in the owner's current and previous demand window, the
        # current being number `window` (now // demand_window): rolled when next touched.
        self.demand_cur = 0
        self.demand_prev = 0
        self.window = 0
        self.sent_at_ns = -1  # when this reporter was last sent a snapshot of the key
        self.seen_changes = -1  # the key's `changes` that snapshot reflected
        # What that snapshot let the reporter spend (`snapshot_allowance_ppm`) and
        # min(remaining, b), the rest of what it acts on: a refresh is owed only when these
        # would change (or its TTL runs out without a batch to vouch for it).
        self.sent_allowance_ppm = -1
        self.sent_floor = -1
        # Plausibility (`mesh.core.owner._plausible`): what this sender has claimed, as the
        # TAT of a meter at the key's rate (ns * rate, like `Gcra`; 0: nothing claimed, the
        # whole tolerance free), and the net usage from it that this owner applied (refunds are
        # bounded by it; every snapshot row to it says it, `SnapshotBatch.applied_net`).
        self.claim_tat = 0
        self.net = 0
        # The largest share (ppm) sent to this reporter in escrow window `share_win` and the
        # one before (`_escrow.note_share`): a silent reporter's floor is escrowed at that.
        self.share_cur = 0
        self.share_prev = 0
        self.share_win = 0
        # A record a hand-over made (`_handover._adopt_watermarks`), not yet confirmed by the
        # worker's own report here, and when its handed watermark expires; 0: not handed.
        self.handed_until_ns = 0
        # The usage and the denials of each report applied, by arrival (`_escrow.note_used`):
        # a silent reporter's floor is escrowed at FLOOR_HEADROOM times that usage's rate at
        # most, and not at all if it was denied as much. None until it reports either.
        self.floor_used: UsageWindow | None = None
        self.floor_denied: UsageWindow | None = None
        # Where an escrow for this reporter's view of the key may start, as its reports say
        # (arrival less `ReportBatch.since_ages`, plus `Escrows.row_slack`), and when that
        # last grew (`_escrow`): -1 until a report says.
        self.row_anchor = -1
        self.row_moved_at = -1
        # What the floor promised to it (`Escrows.promise`) is computed from: its usage and
        # refusals in the window's grains before `demand_grain`, summed once a grain; the
        # current grain's counts are added per row.
        self.demand_grain = -1
        self.demand_used_base = 0
        self.demand_denied_base = 0

    def confirm(self, now_ns: int, worker_epoch: int, unacked_from: int, inflight_max: int) -> bool:
        """The worker's first report to a record a hand-over made: keep the handed watermark
        only if that report makes it plausible (its incarnation, and no sequence past the
        most the worker can have sent: `unacked_from - 1 + inflight_max`, as it holds at most
        `inflight_max` unacknowledged reports of a key), and only until `handed_until_ns`.
        Otherwise the record starts from the worker's own word, as if the report made it.
        Returns False when the handed record was implausible (the caller counts it)."""
        until, self.handed_until_ns = self.handed_until_ns, 0
        if worker_epoch > self.worker_epoch:
            return True  # the worker restarted since: `offer` starts its new incarnation
        sent_max = unacked_from - 1 + inflight_max
        plausible = worker_epoch == self.worker_epoch and self.watermark <= sent_max
        if plausible and now_ns <= until:
            return True
        self.worker_epoch = worker_epoch
        self.watermark = unacked_from - 1
        self.above.clear()
        return plausible

    def roll(self, window: int) -> None:
        """Move the demand windows on to number `window`."""
        self.demand_prev = self.demand_cur if self.window == window - 1 else 0
        self.demand_cur = 0
        self.window = window

    def offer(self, worker_epoch: int, sequence: int, unacked_from: int, window: int) -> int:
        """Decide whether (epoch, sequence) is new, recording it if so."""
        if worker_epoch != self.worker_epoch:
            if worker_epoch < self.worker_epoch:
                return Applied.DUPLICATE  # a report from a dead incarnation: ignore
            self.worker_epoch = worker_epoch  # the worker restarted: its sequence restarts
            self.watermark = unacked_from - 1
            self.above.clear()
        elif unacked_from - 1 > self.watermark:  # acknowledged elsewhere (an earlier owner)
            self.watermark = unacked_from - 1
            self.above = {s for s in self.above if s > self.watermark}
            while self.watermark + 1 in self.above:
                self.watermark += 1
                self.above.discard(self.watermark)
        if sequence <= self.watermark or sequence in self.above:
            return Applied.DUPLICATE
        if sequence > self.watermark + window:
            return Applied.TOO_FAR
        if sequence == self.watermark + 1:
            self.watermark = sequence
            while self.watermark + 1 in self.above:
                self.watermark += 1
                self.above.discard(self.watermark)
        else:
            self.above.add(sequence)
        return Applied.NEW


class KeyState:
    """One RateKey at its owner: the meter and who is reporting it."""

    __slots__ = (
        "policy",
        "meter",
        "version",
        "owner_epoch",
        "reporters",
        "exhausted",
        "applied",
        "changes",
        "tick_at_ns",
        "looked_n",
        "looked_allowance_ppm",
        "looked_floor",
        "live_n",
        "live_until_ns",
        "claim_tol",
        "escrow",
        "demand_window",
        "demand_all_cur",
        "demand_all_prev",
        "opened_ns",
    )

    def __init__(self, policy: TenantRatePolicy, meter: Gcra, owner_epoch: int, now_ns: int):
        self.policy = policy
        self.meter = meter
        self.version = 0
        self.owner_epoch = owner_epoch
        self.reporters: dict[str, ReporterState] = {}
        self.exhausted = meter.remaining(now_ns) == 0
        # Usage applied since the key opened, in its own units: telemetry (`Owner.applied`),
        # and what a hand-over adds to the handed state (`_handover`). It goes with the key.
        self.applied = 0
        self.changes = 0  # usage applied or state handed over: a reporter's view is behind
        self.tick_at_ns = INT_MAX  # when the owner's tick is next due to look at the key
        self.live_n = 0  # reporters with a live lease, as counted when the first of them
        self.live_until_ns = -1  # lapses (here); -1: count again
        # What the tick last looked at (`Owner._look`): the live reporters, the allowance
        # (ppm) of an even share of the key (-1 when shares follow demand), min(remaining, b).
        # Three slots, not a tuple: the reply path reads them for every report.
        self.looked_n = 0
        self.looked_allowance_ppm = -1
        self.looked_floor = 0
        # How far one sender's claims may run ahead of the key's rate, scaled like a TAT
        # (`_plausible.claim_tolerance`).
        self.claim_tol = 0
        # Escrow charged for silent reporters' floors, by worker (`_escrow`); None while
        # there is none, so the reply path pays one attribute read for it.
        self.escrow: dict[str, Escrow] | None = None
        # Demand (used + denied) reported for the key in demand window `demand_window` and
        # the one before, by any reporter: a bound on its live reporters' (`demand_bound`).
        self.demand_window = 0
        self.demand_all_cur = 0
        self.demand_all_prev = 0
        self.opened_ns = now_ns

    def roll_demand(self, window: int) -> None:
        """Move the key's demand windows on to number `window` (`ReporterState.roll`'s rule)."""
        self.demand_all_prev = self.demand_all_cur if self.demand_window == window - 1 else 0
        self.demand_all_cur = 0
        self.demand_window = window

    def demand_span_ns(self, now_ns: int, window_ns: int) -> int:
        """How long the current and previous demand windows have covered at `now_ns`: from
        the previous window's start, and not before the key opened here."""
        span = window_ns + now_ns % window_ns
        age = now_ns - self.opened_ns
        return span if span < age else age

    def demand_bound(self, window: int) -> int:
        """All demand reported for the key in demand window `window` and the one before. It
        is at least what its live reporters' windows hold (`Owner._live_demand`: a subset of
        the same reports), so a bucket `plenty` for it is plenty for them, and the reply
        path need not sum them."""
        if self.demand_window != window:
            self.roll_demand(window)
        return self.demand_all_cur + self.demand_all_prev

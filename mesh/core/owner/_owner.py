"""The owner side of the mesh: meter each owned RateKey and tell its reporters.

Inputs are past-tense facts with the time passed in (`receive`, `tick`, `ring_changed`,
`policy_learned`); outputs are `Send`/`FetchPolicy` effects. The owner holds no durable
state: a restart or a migration starts keys conservatively (seed 004, "Owner restarts"),
except the keys a gracefully leaving owner hands over (`_handover`).

Snapshots go to a key's reporters when they would change what a reporter may spend
(`snapshot_allowance_ppm`), at most once per sync interval. Every batch to a worker vouches
that what it holds from this owner is still current, so a worker holding a lease hears at
least once per TTL, with an empty batch if nothing changed (`mesh.core.reporter` says how a
skipped batch number ends the vouching).
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import NamedTuple

from mesh.core._validate import INT_MAX, check_int, check_str
from mesh.core.config import MS, CoreConfig
from mesh.core.effects import Effect, FetchPolicy, Send
from mesh.core.gcra import NS_PER_S, RECOVERED_PART, Gcra, recovered
from mesh.core.messages import (
    Handover,
    Rejection,
    RejectReason,
    ReportBatch,
    SnapshotBatch,
    above_mask,
)
from mesh.core.owner._escrow import Escrows
from mesh.core.owner._handover import DEPARTED_GRACE_NS, Handovers, export, install
from mesh.core.owner._plausible import Refusal, claim, claim_tolerance
from mesh.core.owner._state import Applied, KeyState, ReporterState
from mesh.core.policy import PolicyCache, RateKey
from mesh.core.ring import Ring
from mesh.core.shares import (
    GRAIN_BITS,
    NEAR_BITS,
    PPM,
    ShareBasis,
    even_part_ppm,
    near,
    plenty,
    refill_units,
    share_basis,
    share_ppm,
    shares_even,
    snapshot_allowance_ppm,
)
from mesh.errors import ConfigTypeError

__all__ = ["Owner"]

SWEEP_NS = 1_000_000_000  # upkeep of every retained key: a pass starts at most once a second
# Keys one tick's part of that upkeep visits: a pass over 250,000 keys is spread over ticks
# instead of stalling one: about 1 ms of a tick; at 5 ms ticks, 200,000 keys a second.
SWEEP_SLICE = 1024
# Telemetry of forgotten keys (`Owner._applied_retired`) is summed per metric under
# OTHER_TENANT. Tenant ids are non-empty, so OTHER_TENANT names none.
OTHER_TENANT = ""
# Generations being fetched at once (`_fetching`): one FetchPolicy per key until the driver
# answers `policy_learned`. Past it a key without its policy is refused POLICY_UNKNOWN and
# not fetched, so one batch of 65,536 unknown keys asks for at most this many.
FETCHING_MAX = 1024


# One snapshot row, in `_Columns`' order (`Owner._row`). A bare tuple, not a
# NamedTuple: building a tuple subclass per row cost the reply path 5% of its instructions.
_Row = tuple[RateKey, int, int, int, int, int, int, int, int, int, int]


class _Columns(NamedTuple):
    """Snapshot rows (`Owner._row`) turned into the columns of a `SnapshotBatch`, named as
    its fields: row field i is column i."""

    keys: tuple[RateKey, ...]
    owner_epochs: tuple[int, ...]
    versions: tuple[int, ...]
    remaining: tuple[int, ...]
    acks: tuple[int, ...]
    receiver_epochs: tuple[int, ...]
    shares_ppm: tuple[int, ...]
    active_reporters: tuple[int, ...]
    floors_ppm: tuple[int, ...]
    applied_above: tuple[int, ...]
    applied_net: tuple[int, ...]


_NO_COLUMNS = _Columns(*[()] * len(_Columns._fields))


class _Outbox:
    """Snapshot rows and rejections gathered per receiver; full batches go out at once."""

    def __init__(self, owner: Owner, now_ns: int) -> None:
        self._owner = owner
        self._now_ns = now_ns
        self.rows: dict[str, list[_Row]] = {}
        self.rejects: dict[str, list[Rejection]] = {}
        self.effects: list[Effect] = []
        self.beats: set[str] = set()

    def snapshot(self, to: str, row: _Row) -> None:
        rows = self.rows.get(to)
        if rows is None:
            rows = self.rows[to] = []
        rows.append(row)
        if len(rows) >= self._owner.config.snapshot_batch_max:
            self.effects.append(self._owner._message(to, self._now_ns, rows, []))
            self.rows[to] = []

    def snapshots(self, to: str, rows: list[_Row]) -> None:
        pending = self.rows.get(to)
        if pending:
            pending.extend(rows)
        else:
            pending = rows
        step = self._owner.config.snapshot_batch_max
        while len(pending) >= step:
            self.effects.append(self._owner._message(to, self._now_ns, pending[:step], []))
            pending = pending[step:]
        self.rows[to] = pending

    def reject(self, to: str, rejection: Rejection) -> None:
        self.rejects.setdefault(to, []).append(rejection)

    def beat(self, to: str) -> None:
        """Send `to` a batch even if it holds nothing: it vouches for what `to` holds."""
        self.beats.add(to)

    def drain(self) -> list[Effect]:
        """What is left per receiver, rows and rejections together at most
        `snapshot_batch_max` a message (the receiver refuses more, SNAPSHOT_ROWS_MAX)."""
        step = self._owner.config.snapshot_batch_max
        message = self._owner._message
        for to in sorted(set(self.rows) | set(self.rejects) | self.beats):
            rows, rejects = self.rows.get(to, []), self.rejects.get(to, [])
            if not (rows or rejects or to in self.beats):
                continue
            while len(rows) + len(rejects) > step:
                room = step - min(len(rows), step)
                self.effects.append(message(to, self._now_ns, rows[:step], rejects[:room]))
                rows, rejects = rows[step:], rejects[room:]
            self.effects.append(message(to, self._now_ns, rows, rejects))
        return self.effects


class Owner:
    """Every key this member owns: GCRA meters, idempotency records, reporter leases."""

    def __init__(
        self,
        member_id: str,
        ring: Ring,
        policies: PolicyCache,
        now_ns: int,
        *,
        incarnation: int = 0,
        config: CoreConfig | None = None,
    ) -> None:
        self.member_id = check_str("member_id", member_id)
        if not isinstance(ring, Ring):
            raise ConfigTypeError("ring", f"must be a Ring, got {type(ring).__name__}")
        if not isinstance(policies, PolicyCache):
            raise ConfigTypeError(
                "policies", f"must be a PolicyCache, got {type(policies).__name__}"
            )
        check_int("now_ns", now_ns)
        self.ring = ring
        self.policies = policies
        self.incarnation = check_int("incarnation", incarnation)
        self.config = config or CoreConfig()
        self.keys: dict[RateKey, KeyState] = {}
        self._owned_since_ns = now_ns
        self._fetching: set[RateKey] = set()
        # When keys are next due at the tick, as a heap of (time, n, key); an entry whose
        # time is not its key's `tick_at_ns` any more was superseded and is skipped.
        self._due: list[tuple[int, int, RateKey]] = []
        self._due_n = 0
        self._swept_ns = now_ns
        # The upkeep's round: every retained key's state, in the order `_sweep` visits them
        # (a key's state is appended when it opens and again after each visit), and how
        # many the current pass has yet to visit. A forgotten or moved key's entry is
        # dropped at its next visit, so this holds at most the keys of one pass.
        self._sweep_order: deque[KeyState] = deque()
        self._sweep_left = 0
        self._sweep_forgot = 0
        self.applied_units = 0  # telemetry: usage applied, in the keys' own units
        # Telemetry: usage applied by keys this owner no longer holds, per metric only, so
        # the sum over scopes never goes down when a key is forgotten or moves. Not per
        # tenant: a forgotten tenant keeps nothing here (a few hundred names kept
        # from 250,000 one-off tenants pinned tens of MiB of allocator arenas), and the
        # exported per-tenant counters stay monotonic without it (telemetry `_Labelled`).
        self._applied_retired: dict[str, int] = {}
        self.duplicates = 0
        # Peers' reports and hand-overs refused, by `Refusal` (`_plausible` says when and
        # how they are counted), and their total, which a driver watches to log them.
        self.refused: dict[str, int] = {r.value: 0 for r in Refusal}
        self.refused_n = 0
        self.handovers = Handovers()  # graceful leave: parked keys, departed members
        self._leases: dict[str, int] = {}  # worker -> its latest reporter lease, any key
        # worker -> the last batch_seq sent to it, and when that batch was built. A worker
        # new (or forgotten by `_sweep`) is numbered from the time in microseconds: past
        # any number it had from us before, so what it holds from then is not vouched for.
        self._out_seq: dict[str, int] = {}
        self._out_at: dict[str, int] = {}
        # Silent reporters' floors, charged to their keys in advance (`_escrow`).
        self.escrows = Escrows(self.config, len(ring), self.member_id)

    @property
    def applied(self) -> dict[RateKey, int]:
        """Telemetry: usage applied per retained key since it opened, in its own units.

        Built on each read from the keys (`KeyState.applied`), so it holds what `keys`
        holds and no more: a key forgotten idle and full (`_sweep`) or moved away by a ring
        change (`ring_changed`) leaves it with its key. Its bound is that of `keys`.
        """
        return {key: ks.applied for key, ks in self.keys.items()}

    def applied_by_scope(self) -> dict[tuple[str, str], int]:
        """Telemetry: usage applied per (tenant, metric) across the retained keys'
        generations, and per (OTHER_TENANT, metric) what forgotten and moved keys had: the
        sum per metric is monotonic; a tenant's own total lasts while it has keys here.
        In units: a key meters sub-units (`TenantRatePolicy.scale`), `scale` a unit."""
        out = {(OTHER_TENANT, metric): n for metric, n in self._applied_retired.items()}
        for key, ks in self.keys.items():
            scope = (key.tenant_id, key.metric)
            out[scope] = out.get(scope, 0) + ks.applied // ks.policy.scale
        return out

    def _forget(self, key: RateKey) -> None:
        """Drop a key, keeping what it applied in the per-scope telemetry total."""
        ks = self.keys.pop(key)
        if ks.applied:
            retired, metric = self._applied_retired, key.metric
            retired[metric] = retired.get(metric, 0) + ks.applied // ks.policy.scale

    def is_member(self, now_ns: int, sender: str) -> bool:
        """Whether `sender` may report or hand over to us: us, a member of our ring, or
        one that left it within `DEPARTED_GRACE_NS` (moves in flight; `_plausible`)."""
        if sender == self.member_id or sender in self.ring:
            return True
        left_ns = self.handovers.departed.get(sender)
        return left_ns is not None and now_ns - left_ns <= DEPARTED_GRACE_NS

    def refuse(self, reason: Refusal, n: int = 1) -> None:
        """Count `n` refusals of a peer's input for `reason`."""
        self.refused[reason] += n
        self.refused_n += n

    # -- inputs ---------------------------------------------------------------------------

    def receive(self, now_ns: int, batch: ReportBatch) -> list[Effect]:
        """Apply a worker's batch; reply to it with snapshots (its acks) and rejections.

        In steps: the batch as a whole (`_screen`), each row's report (`_apply_rows`), the
        reply's rows (`_reply`), and exhaustion published to the key's other reporters. The
        rows' loops inline their common cases: a call per row costs the owner 2% or more.
        """
        out = _Outbox(self, now_ns)
        if not self._screen(now_ns, batch, out):
            return out.drain()
        replied = self._apply_rows(now_ns, batch, out)
        exhausted_now = self._reply(now_ns, batch.sender, replied, out)
        for ks in exhausted_now:  # seed 004: publish exhaustion at once, to everyone
            self._broadcast(now_ns, ks, out, skip=batch.sender)
        return out.drain()

    def _screen(self, now_ns: int, batch: ReportBatch, out: _Outbox) -> bool:
        """Whether `batch`'s rows are to be applied. A batch of a later ring than ours is
        rejected key by key, one from a non-member refused whole (no record, lease or
        reply), an idle mark (`Reporter._mark_idles`, no rows) only noted. Any other renews
        the sender's lease and tells the escrows it was heard from."""
        sender, ring = batch.sender, self.ring
        if batch.ring_epoch > ring.epoch:
            for key in dict.fromkeys(batch.keys):
                out.reject(sender, Rejection(key, RejectReason.STALE_EPOCH, ring.epoch))
            return False
        if not self.is_member(now_ns, sender):
            self.refuse(Refusal.NOT_MEMBER)
            return False
        floors = self.escrows.on()  # serving through partitions: on unless turned off
        if not batch.keys:
            if floors:
                self.escrows.idle_mark(sender, now_ns, batch.heard_batch)
            return False
        self._leases[sender] = now_ns + self.config.reporter_lease_ms * MS
        if floors:
            self.escrows.heard_from(sender, now_ns, batch.heard_batch)
        return True

    def _apply_rows(self, now_ns: int, batch: ReportBatch, out: _Outbox) -> dict[RateKey, KeyState]:
        """Apply each row idempotently, opening keys and reporter records as needed; reject
        the keys not ours or without a policy. Returns the keys to answer, in row order.

        The loop reads the batch's columns and inlines the common case (the next sequence
        of a known reporter): an owner runs it for every report.
        """
        cfg = self.config
        sender, worker_epoch, ring = batch.sender, batch.worker_epoch, self.ring
        keys, me, reorder = self.keys, self.member_id, cfg.reorder_window
        lease_until_ns = now_ns + cfg.reporter_lease_ms * MS
        window = now_ns // (cfg.demand_window_ms * MS)
        floors = self.escrows.on()
        grain = self.escrows.grain(now_ns) if floors else None  # one arrival for the batch
        note_used = self.escrows.note_used
        row_slack = self.escrows.row_slack() if floors else 0
        # Ages not said (a worker one release behind): its floor waits from its last word,
        # which the owner took as the batch's arrival then; so do we.
        n = len(batch.keys)
        ages = (batch.since_ages or (row_slack,) * n) if floors else (-1,) * n
        replied: dict[RateKey, KeyState] = {}
        refused: dict[RateKey, RejectReason] = {}
        units = dups = 0
        for key, seq, delta, denied, floor, age in zip(
            batch.keys,
            batch.sequences,
            batch.deltas,
            batch.denied,
            batch.unacked_from,
            ages,
            strict=True,
        ):
            ks = keys.get(key)  # every retained key is owned: ring_changed drops the rest
            if ks is None:
                if key in refused:
                    continue
                if not ring.owns(me, key):
                    refused[key] = RejectReason.NOT_OWNER
                    continue
                ks = self._open(now_ns, key, out)
                if ks is None:
                    refused[key] = RejectReason.POLICY_UNKNOWN
                    continue
            rs = ks.reporters.get(sender)
            if rs is None:
                if len(ks.reporters) >= cfg.reporters_per_key_max:
                    self._forget_oldest_reporter(ks)
                rs = ks.reporters[sender] = ReporterState(worker_epoch, floor, now_ns)
            if (
                seq == rs.watermark + 1
                and rs.worker_epoch == worker_epoch
                and not rs.above
                and not rs.handed_until_ns
            ):  # floor <= seq: validated
                rs.watermark = seq  # the common case of ReporterState.offer
                outcome = Applied.NEW
            else:
                if rs.handed_until_ns and not rs.confirm(
                    now_ns, worker_epoch, floor, cfg.inflight_reports_max
                ):
                    self.refuse(Refusal.BAD_WATERMARK)  # a leaver's record, not believed
                outcome = rs.offer(worker_epoch, seq, floor, reorder)
            rs.last_seen_ns = now_ns
            if rs.lease_until_ns < now_ns:  # back after a lapse: old demand says nothing now
                rs.demand_cur = rs.demand_prev = 0
                rs.window = window
                ks.changes += 1  # one more active reporter: the others' shares change
                ks.live_until_ns = -1  # count them again
            elif rs.window != window:  # rs.roll(window), inlined
                rs.demand_prev = rs.demand_cur if rs.window == window - 1 else 0
                rs.demand_cur = 0
                rs.window = window
            rs.lease_until_ns = lease_until_ns
            if outcome == Applied.NEW:  # its usage; inlined, as a call per row costs 2%
                # Its view's floor wait began `age` before it sent this (said only at a
                # report's first arrival: a copy the network delayed or repeated says it late).
                if age >= 0 and now_ns - age + row_slack > rs.row_anchor:
                    rs.row_anchor = now_ns - age + row_slack
                    rs.row_moved_at = now_ns
                # Usage that the escrow for this sender's floor already charged is netted,
                # not applied again; the rest goes through the claim meter (`_escrow`).
                netted = 0
                if ks.escrow is not None and delta > 0:
                    netted = self.escrows.room(now_ns, ks, sender, ring)
                    if netted > delta:
                        netted = delta
                rest = delta - netted
                why = claim(rs, ks, now_ns, rest) if rest else None
                if why is None:
                    if netted:
                        self.escrows.absorb(ks, sender, netted)
                        rs.net += netted
                    if rest:
                        ks.meter.apply(now_ns, rest)
                    wanted = (delta if delta > 0 else 0) + denied
                    rs.demand_cur += wanted
                    if ks.demand_window != window:
                        ks.roll_demand(window)
                    ks.demand_all_cur += wanted
                    units += delta
                    ks.applied += delta
                    if grain is not None and (delta > 0 or denied):
                        note_used(rs, delta, denied, grain)  # what a floor follows
                else:  # implausible: seen and acknowledged, nothing applied (`_plausible`)
                    self.refuse(why)
                    if grain is not None and denied:
                        note_used(rs, 0, denied, grain)  # its usage makes no floor
            elif outcome == Applied.DUPLICATE:
                dups += 1
            replied[key] = ks
        self.applied_units += units
        self.duplicates += dups
        for key, reason in refused.items():
            out.reject(sender, Rejection(key, reason, ring.epoch))
        return replied

    def _reply(
        self, now_ns: int, sender: str, replied: dict[RateKey, KeyState], out: _Outbox
    ) -> list[KeyState]:
        """A snapshot row to `sender` for each key of its batch (`_broadcast`'s, inlined:
        once per report). Returns the keys its reports exhausted, for everyone to hear."""
        exhausted_now: list[KeyState] = []
        rows: list[_Row] = []
        ring = self.ring
        floors, promise = self.escrows.on(), self.escrows.promise
        share_floor = self.config.share_floor_ppm
        window_ns = self.config.demand_window_ms * MS
        window = now_ns // window_ns
        for key, ks in replied.items():
            rs = ks.reporters[sender]
            n = ks.live_n if now_ns <= ks.live_until_ns else self._count_live(now_ns, ks)
            if ks.escrow is not None:
                self.escrows.settle(now_ns, ks, ring)
            remaining = ks.meter.remaining(now_ns)
            if remaining == 0:
                if not ks.exhausted:
                    ks.exhausted = True
                    exhausted_now.append(ks)
            elif ks.exhausted and remaining * RECOVERED_PART >= ks.meter.burst:
                # gcra.recovered, inlined: the tick's hysteresis, as the key may not be ticked
                ks.exhausted = False
            b = ks.policy.local_burst_cap
            floor = remaining if remaining < b else b
            if n == 1:  # the only live reporter: the whole budget is its share
                share = PPM
                # snapshot_allowance_ppm(remaining, PPM, 1, b), inlined
                rs.sent_allowance_ppm = floor * PPM
            else:
                # shares.share_basis and shares_even, inlined: shares are even (the same for
                # every reporter, whatever its demand) when the spread is below one step.
                # `plenty` of the live reporters' demand; summed only when the bound on it
                # (every report's) is not plenty: most keys' buckets are far from drained.
                # The refill over the demand's span only when the bound is not plenty
                # without it (it can only make demand more plenty).
                total, drained = -1, False
                bound = ks.demand_bound(window)
                if not plenty(remaining, bound):
                    refill = refill_units(ks.meter.rate, ks.demand_span_ns(now_ns, window_ns))
                    if not plenty(remaining, bound, refill):
                        _, total = self._live_demand(now_ns, ks)
                        drained = not plenty(remaining, total, refill)
                even = even_part_ppm(0 if drained else remaining, ks.meter.burst, share_floor)
                even_each = even // n
                if PPM - even < ((even_each >> GRAIN_BITS) or 1):  # shares.share_step, inlined
                    share = even_each
                    allowance = snapshot_allowance_ppm(remaining, even_each, n, b)
                    # shares.near, inlined, of what the tick last looked at (`_look`)
                    looked_allowance, looked_floor = ks.looked_allowance_ppm, ks.looked_floor
                    da, df = allowance - looked_allowance, floor - looked_floor
                    unchanged = (
                        ks.looked_n == n
                        and (da if da >= 0 else -da) << NEAR_BITS <= looked_allowance
                        and (df if df >= 0 else -df) << NEAR_BITS <= looked_floor
                    )
                else:  # shares.share_ppm, inlined: a ShareBasis per report costs more
                    if total < 0:
                        _, total = self._live_demand(now_ns, ks)
                    if total:
                        by_demand = (PPM - even) * (rs.demand_cur + rs.demand_prev) // total
                        share = by_demand - by_demand % ((even_each >> GRAIN_BITS) or 1) + even_each
                    else:
                        share = PPM // n
                    allowance = snapshot_allowance_ppm(remaining, share, n, b)
                    unchanged = False
                rs.sent_allowance_ppm = allowance
                if not unchanged:  # the others' views are behind: the next tick sees to it
                    ks.changes += 1
                    self.wake(ks)
            rs.seen_changes = ks.changes
            # Owner._row, inlined: a call per report slowed the owner enough to raise the
            # cluster's d p99 (`mesh bench cluster`); test_owner pins the two together.
            ks.version += 1
            rs.sent_at_ns = now_ns
            rs.sent_floor = floor
            rows.append(
                (
                    key,
                    ks.owner_epoch,
                    ks.version,
                    remaining,
                    rs.watermark,
                    rs.worker_epoch,
                    share,
                    n,
                    promise(ks, rs, sender, share, now_ns) if floors else 0,
                    above_mask(rs.watermark, rs.above) if rs.above else 0,
                    rs.net,
                )
            )
        out.snapshots(sender, rows)
        return exhausted_now

    def tick(self, now_ns: int) -> list[Effect]:
        """The sync interval: tell active reporters what changed for them; vouch for the
        rest; expire what is old.

        Only keys with a live reporter lease and something due are visited; the upkeep of
        every retained key (idempotency records past retention, idle full buckets) runs
        once per `SWEEP_NS`, so an owner holding many quiet keys stays cheap to tick.
        """
        out = _Outbox(self, now_ns)
        sync_ns = self.config.sync_interval_ms * MS
        due, keys = self._due, self.keys
        while due and due[0][0] <= now_ns:
            at, _, key = heappop(due)
            ks = keys.get(key)
            if ks is None or ks.tick_at_ns != at:
                continue  # forgotten, or due at another time since
            ks.tick_at_ns = INT_MAX
            if now_ns > ks.live_until_ns:
                self._count_live(now_ns, ks)  # opens escrows for reporters gone silent
            if ks.escrow is not None:
                self.escrows.settle(now_ns, ks, self.ring)
            if ks.exhausted and recovered(ks.meter.remaining(now_ns), ks.meter.burst):
                ks.exhausted = False
            self._broadcast(now_ns, ks, out, sync_ns=sync_ns)
        self._vouch(now_ns, out)
        if self._sweep_left or now_ns - self._swept_ns >= SWEEP_NS:
            self._sweep(now_ns)
        return out.drain()

    def _vouch(self, now_ns: int, out: _Outbox) -> None:
        """A batch to every worker holding a lease that has not had one for most of a TTL:
        it keeps the views this owner did not need to refresh from expiring. Two sync
        intervals short of the TTL: one for this tick's lateness, one for the trip."""
        cfg = self.config
        period_ns = max(cfg.sync_interval_ms, cfg.snapshot_ttl_ms - 2 * cfg.sync_interval_ms) * MS
        out_at = self._out_at
        for worker, until in list(self._leases.items()):
            if until < now_ns:
                del self._leases[worker]
            elif now_ns - out_at.get(worker, -period_ns) >= period_ns:
                out.beat(worker)

    def _sweep(self, now_ns: int) -> None:
        """Part of the upkeep: forget idempotency records past retention and keys that are
        idle and full, visiting at most SWEEP_SLICE keys and resuming where the last tick
        stopped; a pass (which also forgets the batch numbers of workers we have not
        written to for as long) starts at most once per SWEEP_NS."""
        retention_ns = self.config.idempotency_retention_ms * MS
        order, keys = self._sweep_order, self.keys
        if not self._sweep_left:  # a new pass
            self._swept_ns = now_ns
            for worker in [
                w
                for w, at in self._out_at.items()
                if now_ns - at > retention_ns and w not in self._leases
            ]:
                del self._out_at[worker], self._out_seq[worker]
                self.escrows.forget(worker)
            self._sweep_left = len(order)
            self._sweep_forgot = 0
        n = min(SWEEP_SLICE, self._sweep_left)
        self._sweep_left -= n
        for _ in range(n):
            ks = order.popleft()
            key = ks.policy.rate_key
            if keys.get(key) is not ks:
                continue  # forgotten or moved since; its entry ends here
            for worker, rs in list(ks.reporters.items()):
                if now_ns - rs.last_seen_ns > retention_ns:
                    del ks.reporters[worker]
                    ks.live_until_ns = -1
            if (
                not ks.reporters
                and ks.tick_at_ns == INT_MAX
                and ks.meter.remaining(now_ns) >= ks.meter.burst
            ):
                self._forget(key)  # idle and full: forgetting it loses nothing
                self._sweep_forgot += 1
            else:
                order.append(ks)
        if not self._sweep_left and self._sweep_forgot > max(len(self.keys), 4096):
            self.keys = dict(self.keys)  # forgot more than it kept: a smaller table
            self._sweep_forgot = 0

    def ring_changed(self, now_ns: int, ring: Ring) -> None:
        """Adopt a new ring; keys that moved away are dropped (their new owner starts them)."""
        self.handovers.ring_changed(now_ns, self.ring, ring, self.member_id)
        self.escrows.ring_changed(self.ring, ring)
        self.ring = ring
        # Even with the same members: rings between the two may have placed keys elsewhere
        # (a coalesced watch), so a key opened now may have been metered there meanwhile.
        self._owned_since_ns = now_ns
        moved = [k for k in self.keys if not ring.owns(self.member_id, k)]
        for key in moved:
            self._forget(key)
        if moved:  # skip a batch number: no worker may take our word for what moved
            self._skip_batch(*self._out_seq)

    def policy_learned(self, key: RateKey) -> None:
        """The driver fetched (or failed to fetch) a generation: allow asking again."""
        self._fetching.discard(key)

    def hand_over(self, now_ns: int, ring: Ring) -> list[Effect]:
        """Graceful leave: every held key's state, sent to its owner in `ring` (without us)."""
        return export(self, now_ns, ring)

    def take_handover(self, now_ns: int, handover: Handover) -> None:
        """A leaving owner's keys: resume or tighten those that are ours to hold."""
        install(self, now_ns, handover)

    # -- internals ------------------------------------------------------------------------

    def _open(self, now_ns: int, key: RateKey, out: _Outbox) -> KeyState | None:
        policy = self.policies.get(key)
        if policy is None:
            fetching = self._fetching
            if key not in fetching and len(fetching) < FETCHING_MAX:
                fetching.add(key)
                out.effects.append(FetchPolicy(key))
            return None
        # Start conservatively (exhausted, refilling at R) unless this owner has held its
        # ring position long enough for any bucket it never saw to have refilled: keys are
        # only forgotten when full, so an unseen key was idle for at least that long.
        refill_ns = -(-policy.global_burst * NS_PER_S // policy.target_rate)
        exhausted = now_ns - self._owned_since_ns < refill_ns
        meter = Gcra(policy.target_rate, policy.global_burst, now_ns, exhausted=exhausted)
        ks = self.keys[key] = KeyState(policy, meter, self.ring.epoch, now_ns)
        self._sweep_order.append(ks)
        ks.claim_tol = claim_tolerance(policy, self.config)
        self.handovers.opened(  # a handed state; its sender has left our ring
            now_ns, ks, self.config.reporters_per_key_max, len(self.ring) + 1, self.is_member
        )
        return ks

    def _forget_oldest_reporter(self, ks: KeyState) -> None:
        oldest = min(ks.reporters, key=lambda w: (ks.reporters[w].last_seen_ns, w))
        del ks.reporters[oldest]
        ks.live_until_ns = -1
        self._skip_batch(oldest)  # we no longer know what it holds of this key

    def wake(self, ks: KeyState, at_ns: int = 0) -> None:
        """Have the tick look at the key at `at_ns` (0: the next tick), unless it will sooner."""
        if at_ns < ks.tick_at_ns:
            ks.tick_at_ns = at_ns
            self._due_n += 1
            heappush(self._due, (at_ns, self._due_n, ks.policy.rate_key))

    def _next_seq(self, worker: str, now_ns: int) -> int:
        seq = self._out_seq.get(worker)
        return (now_ns // 1000 if seq is None else seq) + 1

    def _skip_batch(self, *workers: str) -> None:
        """Number the next batch to each of `workers` one past the next: the gap ends the
        vouching for every view this owner gave them before (`mesh.core.reporter`)."""
        for w in workers:
            if w in self._out_seq:  # a worker we never wrote to holds nothing of ours
                self._out_seq[w] += 1

    def _broadcast(
        self,
        now_ns: int,
        ks: KeyState,
        out: _Outbox,
        *,
        skip: str = "",
        sync_ns: int = 0,
    ) -> None:
        """Snapshot to live reporters but `skip`. With `sync_ns` (the tick), only to those
        whose view the key's changes since their last snapshot would alter, and not sooner
        than `sync_ns` after it; note when the key is next due.
        In the tick, a key is due again only for a reporter its changes have not reached
        yet; the tick never looks at a key merely because a lease lapsed. The reporters
        still live hear of a larger share in their next reply."""
        key = ks.policy.rate_key
        floors = self.escrows.on()
        basis: ShareBasis | None = None
        remaining = floor = 0
        b = ks.policy.local_burst_cap
        snapshot = out.snapshot
        next_ns = INT_MAX
        for worker, rs in ks.reporters.items():  # insertion order: deterministic
            if rs.lease_until_ns < now_ns or worker == skip:
                continue
            if sync_ns:
                if rs.seen_changes == ks.changes:
                    continue  # its view is current: our batches vouch for it
                due_at = rs.sent_at_ns + sync_ns
                if due_at > now_ns:
                    if due_at < next_ns:
                        next_ns = due_at
                    continue
            if basis is None:  # once per key, not per receiver
                if now_ns > ks.live_until_ns:
                    self._count_live(now_ns, ks)  # opens escrows for reporters gone silent
                if ks.escrow is not None:
                    self.escrows.settle(now_ns, ks, self.ring)
                remaining = ks.meter.remaining(now_ns)
                basis = self._share_basis(now_ns, ks, remaining)
                floor = remaining if remaining < b else b
                if sync_ns:
                    _look(ks, basis, remaining, floor)
            share = share_ppm(basis, rs.demand_cur + rs.demand_prev)
            allowance = snapshot_allowance_ppm(remaining, share, basis.active, b)
            rs.seen_changes = ks.changes
            if sync_ns and near(allowance, rs.sent_allowance_ppm) and near(floor, rs.sent_floor):
                continue  # a refresh would change nothing it acts on
            rs.sent_allowance_ppm = allowance
            row = self._row(
                now_ns, key, ks, rs, worker, remaining, floor, share, basis.active, floors
            )
            snapshot(worker, row)
        if sync_ns and next_ns < INT_MAX:
            self.wake(ks, next_ns)

    def _row(
        self,
        now_ns: int,
        key: RateKey,
        ks: KeyState,
        rs: ReporterState,
        worker: str,
        remaining: int,
        floor: int,
        share: int,
        active: int,
        floors: bool,
    ) -> _Row:
        """`worker`'s snapshot row of `ks` now, a new version of the key; notes what it was
        sent (the allowance, which the two callers work out apart, they note themselves).
        The one definition of a row: a broadcast's; a reply's (`_reply`) inlines it."""
        ks.version += 1
        rs.sent_at_ns = now_ns
        rs.sent_floor = floor
        return (
            key,  # keys
            ks.owner_epoch,  # owner_epochs
            ks.version,  # versions
            remaining,  # remaining
            rs.watermark,  # acks
            rs.worker_epoch,  # receiver_epochs
            share,  # shares_ppm
            active,  # active_reporters
            self.escrows.promise(ks, rs, worker, share, now_ns) if floors else 0,  # floors_ppm
            above_mask(rs.watermark, rs.above) if rs.above else 0,  # applied_above
            rs.net,  # applied_net
        )

    def _share_basis(self, now_ns: int, ks: KeyState, remaining: int) -> ShareBasis:
        """The key's `ShareBasis` (`mesh.core.shares` says how shares are made), computed
        once per key per round. Callers ask only while some reporter's lease is live, so
        `active` is at least 1."""
        active, total = self._live_demand(now_ns, ks)
        span_ns = ks.demand_span_ns(now_ns, self.config.demand_window_ms * MS)
        refill = refill_units(ks.meter.rate, span_ns)
        return share_basis(
            remaining, ks.meter.burst, self.config.share_floor_ppm, active, total, refill
        )

    def _live_demand(self, now_ns: int, ks: KeyState) -> tuple[int, int]:
        """(reporters with a live lease, their summed demand in the current and previous
        demand window), rolling each reporter's windows on to now."""
        active = total = 0
        window = now_ns // (self.config.demand_window_ms * MS)
        for rs in ks.reporters.values():
            if rs.lease_until_ns >= now_ns:
                active += 1
                if rs.window != window:
                    rs.roll(window)
                total += rs.demand_cur + rs.demand_prev
        return active, total

    def _count_live(self, now_ns: int, ks: KeyState) -> int:
        """Reporters with a live lease on the key; the count holds until the first lapses,
        or until a reporter's member may have gone silent: one that did gets an escrow for
        its floor (`_escrow`)."""
        n, until = 0, INT_MAX
        escrows = self.escrows
        check = escrows.check if escrows.on() else None
        for worker, rs in ks.reporters.items():
            if rs.lease_until_ns >= now_ns:
                n += 1
                if rs.lease_until_ns < until:
                    until = rs.lease_until_ns
            if check is not None:
                again = check(now_ns, ks, worker, rs)
                if 0 <= again < until:
                    until = again
        ks.live_n, ks.live_until_ns = n, until
        return n

    def _message(self, to: str, now_ns: int, rows: list[_Row], rejects: list[Rejection]) -> Send:
        c = _Columns._make(zip(*rows, strict=True)) if rows else _NO_COLUMNS
        seq = self._out_seq[to] = self._next_seq(to, now_ns)
        self._out_at[to] = now_ns
        if self.escrows.on():
            self.escrows.sent(to, seq, now_ns)
            floors = c.floors_ppm
        else:
            floors = ()
        return Send(
            to,
            SnapshotBatch.trusted(
                self.member_id,
                self.ring.epoch,
                self.incarnation,
                now_ns,
                c.keys,
                c.owner_epochs,
                c.versions,
                c.remaining,
                c.acks,
                c.receiver_epochs,
                c.shares_ppm,
                c.active_reporters,
                tuple(rejects),
                seq,
                floors,
                c.applied_above if any(c.applied_above) else (),
                c.applied_net,
            ),
        )


def _look(ks: KeyState, basis: ShareBasis, remaining: int, floor: int) -> None:
    """Remember what every reporter of the key was told (or found near enough) by a tick:
    the live count, the allowance of an even share (-1 when shares follow demand) and
    min(remaining, b). A report that leaves these near needs no look (`receive`)."""
    ks.looked_n = basis.active
    ks.looked_allowance_ppm = (
        snapshot_allowance_ppm(
            remaining,
            basis.even_ppm,
            basis.active,
            ks.policy.local_burst_cap,
        )
        if shares_even(basis)
        else -1
    )
    ks.looked_floor = floor

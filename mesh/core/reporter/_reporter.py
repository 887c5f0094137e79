"""The worker side of the mesh: local views, usage accumulation, batching, snapshot intake.

The hot path (mesh.core.admission) spends a view's `avail` and tells the view's sink when usage
first appears or crosses the report threshold. Everything else happens here, driven by the
node (or the simulator, or a test) with the time passed in:

* `flush(now)`: usage per key becomes a `UsageReport` with the next sequence; reports are
  batched by owner and resent, with the same epoch and sequence, until acknowledged.
* `receive(now, SnapshotBatch)`: a snapshot acknowledges reports and resets the allowance;
  avail = allowance - (inflight + pending), so usage after the snapshot is not forgotten.
* `tick(now)`: views past their TTL stop expanding traffic (seed 004: restrict, not guess),
  unless their owner vouched for them since (below).

An owner sends a key's snapshot again only when it would change what the receiver may
spend; every batch it sends a worker (an empty one at least every TTL while the worker holds
a lease) vouches that the views it gave that worker before are still current. Its batches to
one worker are numbered: a number skipped (a batch lost, or the owner forgetting what it
told us) ends the vouching for every view from before it, and those views expire at their
TTL as they would have without it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from heapq import heappop, heappush
from typing import NamedTuple

from mesh.core._validate import check_int, check_str
from mesh.core.config import MS, CoreConfig
from mesh.core.effects import Effect, Send
from mesh.core.gate import NEVER, Gate
from mesh.core.gcra import NS_PER_S, Gcra
from mesh.core.messages import RejectReason, ReportBatch, SnapshotBatch
from mesh.core.policy import BOUNDS, RateKey, TenantRatePolicy, Unit
from mesh.core.reporter._gate import GlobalGate, Inflight, SnapshotState
from mesh.core.reporter._rto import RetryTimer
from mesh.core.ring import Ring
from mesh.core.shares import (
    PPM,
    floor_burst,
    floor_ppm,
    floor_start,
    share_round,
)
from mesh.core.verdict import Reason, Suspension
from mesh.errors import ConfigTypeError

__all__ = ["Reporter", "EAGER_REPORTS_NS"]

# How long a view reports each admission at once after it denied an ask of at most b while
# usage of its own was unreflected (`GlobalGate.eager_until_ns`): about a client's retry
# interval, so the ask finds the view empty of in-flight units when it comes back.
EAGER_REPORTS_NS = 100 * MS


def _noop() -> None:
    pass


class _Vouching(NamedTuple):
    """What an owner's numbered batches vouch for (`Reporter._vouched_by`)."""

    incarnation: int  # the owner incarnation numbering them
    last_batch: int  # the newest batch_seq heard from it
    first_batch: int  # views brought by this batch or later are vouched for (none before)
    until_ns: int  # the vouching lapses then: a TTL after the newest batch


class Reporter:
    """All of one worker incarnation's global views, and its conversation with owners."""

    def __init__(
        self,
        worker_id: str,
        worker_epoch: int,
        ring: Ring,
        *,
        config: CoreConfig | None = None,
    ) -> None:
        self.worker_id = check_str("worker_id", worker_id)
        self.worker_epoch = check_int("worker_epoch", worker_epoch)
        if not isinstance(ring, Ring):
            raise ConfigTypeError("ring", f"must be a Ring, got {type(ring).__name__}")
        self.ring = ring
        self.config = config or CoreConfig()
        self.gates: dict[RateKey, GlobalGate] = {}
        self.wake: Callable[[], None] = _noop  # the driver's "flush soon" (threshold crossed)
        # Told, for each acknowledged report, how long its usage took to reach a snapshot
        # (from the flush that created it): the d of the envelope, for telemetry and the sim.
        self.on_ack: Callable[[int], None] | None = None
        self.ring_behind = ring.epoch  # newest ring epoch an owner has told us about
        self._sink_fn = self._sink  # one bound method shared by every view, not one each
        self._dirty: list[GlobalGate] = []
        self._live: dict[RateKey, GlobalGate] = {}  # views the tick must watch
        self._unacked: dict[RateKey, GlobalGate] = {}  # views with reports in flight
        self._send_now: dict[RateKey, GlobalGate] = {}  # to (re)send at the next flush
        self._due: list[tuple[int, int, RateKey]] = []  # heap: (resend_at_ns, n, key)
        self._due_seq = 0
        self._retired: set[RateKey] = set()  # superseded generations, dropped once drained
        # Where a new view's report sequence starts: past every sequence a view this
        # incarnation dropped had used. An owner remembers (worker_epoch, sequence) per key
        # for longer than a view lives idle here, so a view made again for a key must not
        # number its reports from 1: they would be taken for duplicates, acknowledged and
        # never applied (docs/guarantees.md, "report numbering").
        self._sequence_from = 1
        self.reports_sent = 0
        self.snapshots_taken = 0
        self.resent = 0  # reports sent more than once (telemetry)
        self._vouch: dict[str, _Vouching] = {}  # per owner; dropped when it leaves the ring
        # When a batch from each owner last arrived (any batch): a view's floor opens a while
        # after its owner's last word (`_serve_floor`). Per owner; dropped when it leaves.
        self._heard: dict[str, int] = {}
        # Views serving from a floor, per owner: any batch from it ends them at once (the
        # owner stops charging their escrows when we confirm it, which may be before the
        # next tick). At most the views with a floor; dropped with the owner.
        self._floored: dict[str, list[GlobalGate]] = {}
        # Idle marks (`_mark_idles`), per owner: when we last sent it a report, when we last
        # told it we went idle, and the latest send time of a report it acknowledged. A view
        # floors only while the last is later than the second: the owner's last word from us
        # was then a report, and it escrows. Per owner; dropped when it leaves the ring.
        self._reported_to: dict[str, int] = {}
        self._idle_at: dict[str, int] = {}
        self._acked_sent_at: dict[str, int] = {}
        self.retry = RetryTimer(
            self.config.report_retry_ms * MS, self.config.report_retry_max_ms * MS
        )

    # -- views ----------------------------------------------------------------------------

    def open_gate(self, policy: TenantRatePolicy) -> GlobalGate:
        """The view for a policy's RateKey, created in BOOT with a bootstrap allowance."""
        key = policy.rate_key
        v = self.gates.get(key)
        if v is None:
            v = self.gates[key] = GlobalGate(policy, self._sink_fn)
            v.next_sequence = self._sequence_from
            self._boot(v, 0)
        self._retired.discard(key)
        return v

    def retire(self, key: RateKey) -> None:
        """A newer generation replaced this key; keep reporting it until it drains."""
        if key in self.gates:
            self._retired.add(key)

    def bootstrap_allowance(self, policy: TenantRatePolicy) -> int:
        """A small first allowance for a key with no snapshot: ceil(b / N_live), so a fleet
        that meets a key at once spends about b in all, not N times the global burst. In
        whole units (times `scale` in sub-units), so a view never boots unable to admit one."""
        scale = policy.scale
        return -(-(policy.local_burst_cap // scale) // self._n_live()) * scale

    def _n_live(self) -> int:
        return max(1, len(self.ring)) * self.config.bootstrap_divisor

    def _coin(self, key: RateKey, salt: int) -> int:
        """A deterministic 'random' number in [0, 1e6) for share_round."""
        token = f"{self.worker_id}|{key.ring_token()}|{salt}".encode()
        return zlib.crc32(token) % PPM

    def _boot(self, v: GlobalGate, now_ns: int) -> None:
        """No fresh snapshot and nothing unacknowledged: start from a small allowance.

        A key never heard of gets ceil(b / N_live). A view that has heard from its owner
        before uses what it learned: if the owner had at least b left (plus the refill since
        then) the key is not scarce and it gets the same; if the key was scarce, it may
        claim its N_live-th of what was left plus the refill, rounded at random, so a hot
        key spread thinly over many workers is not re-granted a unit per worker each time a
        view idles.
        """
        v.state = SnapshotState.BOOT
        v.floor = None
        v.applied_above = 0  # nothing unacknowledged: no report past a gap either
        # Idle: what an owner left unapplied before is in the past of the envelope; the
        # next row that says `applied_net` starts the comparison again (`note_applied`).
        v.net = None
        b = v.policy.local_burst_cap
        budget = b
        if v.had_snapshot:
            refill = v.policy.target_rate * max(0, now_ns - v.snap_at_ns) // NS_PER_S
            budget = min(b, v.snap_remaining + refill)
        if budget >= b:
            v.allowance = self.bootstrap_allowance(v.policy)
        else:
            v.allowance = share_round(
                budget * PPM // self._n_live(), self._coin(v.key, now_ns + v.next_sequence)
            )
        # The bootstrap window (one TTL to hear from the owner) starts with the first report.
        v.boot_since_ns = -1
        v.fresh_until_ns = NEVER
        v.set_verdicts(BOUNDS["global"])
        v.recompute()
        self._live[v.key] = v

    def _sink(self, v: Gate) -> None:
        """Hot path callback: first usage since the last flush, or the threshold crossed."""
        assert isinstance(v, GlobalGate)
        if not v.marked:
            v.marked = True
            self._dirty.append(v)
            self._live[v.key] = v
            unit = v.policy.unit
            v.flush_at = (
                self.config.report_threshold_bytes
                if unit is Unit.BYTES
                else self.config.report_threshold_units
            )
            allowance = v.allowance // v.scale  # flush_at counts `pending`: units
            if v.state is SnapshotState.BOOT and not v.inflight and allowance < v.flush_at:
                # It admits nothing past its bootstrap allowance until its owner answers its
                # first report: that goes once the allowance is spent, not at the next tick
                # (a flash crowd on a cold key).
                v.flush_at = allowance if allowance > 0 else 1
            if v.eager_until_ns and (v.eager_until_ns < 0 or v.reported_at_ns < v.eager_until_ns):
                v.flush_at = 1  # a larger ask waits on what is in flight: report at once
            if v.pending < v.flush_at:
                return
        v.flush_at = NEVER
        self.wake()

    # -- inputs ---------------------------------------------------------------------------

    def flush(self, now_ns: int) -> list[Effect]:
        """Turn accumulated usage into reports and (re)send what is unacknowledged."""
        cfg = self.config
        dirty, self._dirty = self._dirty, []
        send_now, self._send_now = self._send_now, {}
        for v in dirty:
            v.marked = False
            v.flush_at = 1
            if v.eager_until_ns < 0:
                v.eager_until_ns = now_ns + EAGER_REPORTS_NS
            if not (v.pending or v.denied):
                continue
            if len(v.inflight) >= cfg.inflight_reports_max:
                v.marked = True  # keep accumulating; it goes out when acks make room
                self._dirty.append(v)
                continue
            if not v.inflight:
                v.inflight = []  # replace the shared empty list before the first append
            # Reports are in sub-units, as the owner meters (`Gate`: scale 1 is units).
            delta = v.pending * v.scale
            v.inflight.append(Inflight(v.next_sequence, delta, v.denied * v.scale, now_ns))
            v.next_sequence += 1
            if v.state is SnapshotState.BOOT and v.boot_since_ns < 0:
                v.boot_since_ns = now_ns
                v.fresh_until_ns = now_ns + cfg.snapshot_ttl_ns
            v.inflight_sum += delta
            v.pending = 0
            v.denied = 0
            self._unacked[v.key] = v
            send_now[v.key] = v
        # Resends: only views whose earliest resend is due, from a queue ordered by time,
        # so a flush costs what it sends, not what is in flight (which grows with d).
        due, unacked = self._due, self._unacked
        while due and due[0][0] <= now_ns:
            at, _, key = heappop(due)
            w = unacked.get(key)
            if w is None or w.resend_at_ns != at:
                continue  # acknowledged and dropped, or rescheduled since
            if not w.inflight:
                del unacked[key]
                continue
            send_now[key] = w
        timeouts: dict[str, int] = {}  # per owner, for this flush
        by_owner: dict[str, list[tuple[RateKey, int, int, int, int, int]]] = {}
        heard = self._heard
        for key, v in send_now.items():
            if not v.inflight:  # acknowledged since it was queued (a ring change)
                unacked.pop(key, None)
                continue
            if v.owner_ring_epoch != self.ring.epoch:
                v.owner = self.ring.owner_of(key) if len(self.ring) else None
                v.owner_ring_epoch = self.ring.epoch
            owner = v.owner
            if owner is None:  # no ring yet: look again after the shortest timeout
                self._schedule(v, now_ns + self.retry.min_ns)
                continue
            floor = v.inflight[0].sequence  # everything below it is acknowledged
            # How long ago its floor's wait began (`_serve_floor`): the owner escrows from
            # no later than that (`mesh.core.owner._escrow`).
            since = heard.get(owner, -1)
            if v.inflight[0].created_ns > since:
                since = v.inflight[0].created_ns
            age = now_ns - since
            next_ns = NEVER
            timeout = timeouts.get(owner)
            if timeout is None:
                timeout = timeouts[owner] = self.retry.timeout_ns(owner)
            for r in v.inflight:
                at = r.sent_at_ns + timeout if r.sent_at_ns >= 0 else now_ns
                if at <= now_ns:
                    if r.sends:
                        self.resent += 1
                        self.retry.fired(owner, now_ns)
                        timeout = timeouts[owner] = self.retry.timeout_ns(owner)
                    r.sent_at_ns = now_ns
                    r.sends += 1
                    v.reported_at_ns = now_ns
                    by_owner.setdefault(owner, []).append(
                        (key, r.sequence, r.delta, r.denied, floor, age)
                    )
                    at = now_ns + timeout
                if at < next_ns:
                    next_ns = at
            self._schedule(v, next_ns)
        out: list[Effect] = []
        for owner in sorted(by_owner):
            self._reported_to[owner] = now_ns
            heard_batch = self._heard_batch(owner)
            rows = by_owner[owner]
            for i in range(0, len(rows), cfg.report_batch_max):
                chunk = rows[i : i + cfg.report_batch_max]
                keys, seqs, deltas, denied, floors, ages = zip(*chunk, strict=True)
                out.append(
                    Send(
                        owner,
                        ReportBatch.trusted(
                            self.worker_id,
                            self.ring.epoch,
                            self.worker_epoch,
                            keys,
                            seqs,
                            deltas,
                            denied,
                            floors,
                            heard_batch,
                            ages if cfg.partition_floor_ms > 0 else (),
                        ),
                    )
                )
                self.reports_sent += len(chunk)
        if self._reported_to and cfg.partition_floor_ms > 0:
            self._mark_idles(now_ns, out)
        return out

    def _mark_idles(self, now_ns: int, out: list[Effect]) -> None:
        """An empty batch to each owner we sent no report for `idle_mark_ns`, once per such
        pause: we went idle, not silent. An owner escrows a floor for a member silent for a
        lease (`mesh.core.owner._escrow`); an idle one tells it not to (and so has no floor
        until a later report of it is acknowledged). Marking idle only ever turns floors and
        escrows off, so a mark sent while reports are in flight is safe, merely early."""
        for owner, at in list(self._reported_to.items()):
            if now_ns - at < self.config.idle_mark_ns or self._idle_at.get(owner, -1) > at:
                continue
            if owner not in self.ring:
                del self._reported_to[owner]
                continue
            self._idle_at[owner] = now_ns
            out.append(
                Send(
                    owner,
                    ReportBatch.trusted(
                        self.worker_id,
                        self.ring.epoch,
                        self.worker_epoch,
                        (),
                        (),
                        (),
                        (),
                        (),
                        self._heard_batch(owner),
                    ),
                )
            )

    def _heard_batch(self, owner: str) -> int:
        """The newest batch number we received from `owner`'s current incarnation (0:
        none): the owner escrows our floors from when it sent that (`_escrow`)."""
        st = self._vouch.get(owner)
        return 0 if st is None else st.last_batch

    def receive(self, now_ns: int, batch: SnapshotBatch) -> int:
        """Take an owner's snapshots and rejections. Returns how many views changed."""
        ttl_ns = self.config.snapshot_ttl_ns
        changed = 0
        epoch, inc = self.worker_epoch, batch.owner_incarnation
        views = self.gates
        owner, sample, on_ack = batch.sender, self.retry.sample, self.on_ack
        seq = batch.batch_seq
        floors = self.config.partition_floor_ms > 0
        back = floors and now_ns - self._heard.get(owner, now_ns) > self.config.escrow_after_ns
        self._heard[owner] = now_ns
        floored = self._floored.pop(owner, None)
        if floored:
            for fv in floored:
                if fv.floor is not None:
                    self._end_floor(fv)
        if seq:
            self._vouched_by(owner, inc, seq, now_ns + ttl_ns)
        promised = batch.floors_ppm or (0,) * len(batch.keys)
        above = batch.applied_above or (0,) * len(batch.keys)
        nets = batch.applied_net or (-1,) * len(batch.keys)  # -1: not said (an older owner)
        for (
            key,
            owner_epoch,
            version,
            remaining,
            ack,
            receiver_epoch,
            share,
            active,
            part,
            applied,
            net,
        ) in zip(
            batch.keys,
            batch.owner_epochs,
            batch.versions,
            batch.remaining,
            batch.acks,
            batch.receiver_epochs,
            batch.shares_ppm,
            batch.active_reporters,
            promised,
            above,
            nets,
            strict=True,
        ):
            v = views.get(key)
            if v is None or receiver_epoch != epoch:
                continue  # not ours, or addressed to an earlier incarnation of this worker
            order = (owner_epoch, inc, version)
            if order <= v.snap_order:
                continue  # reordered or duplicated: never step back to an older view
            acked = v.take_snapshot(
                order,
                remaining,
                ack,
                share,
                active,
                now_ns,
                ttl_ns,
                self._coin(key, version),
                applied,
            )
            if net >= 0:
                v.note_applied((owner, owner_epoch, inc), net)
            v.snap_floor_ppm = part
            v.snap_from = owner
            v.snap_incarnation = inc
            v.snap_batch = seq
            for r in acked:
                if r.sent_at_ns > self._acked_sent_at.get(owner, -1):
                    self._acked_sent_at[owner] = r.sent_at_ns
                if r.sends == 1:  # Karn: a resent report's ack could answer either send
                    sample(owner, now_ns - r.sent_at_ns)
                if on_ack is not None:
                    on_ack(now_ns - r.created_ns)
            v.set_verdicts(BOUNDS["global"])
            self._live[key] = v
            self.snapshots_taken += 1
            changed += 1
        for rej in batch.rejections:
            v = self.gates.get(rej.rate_key)
            if rej.ring_epoch > self.ring_behind:
                self.ring_behind = rej.ring_epoch
            if v is not None and rej.reason is RejectReason.NOT_OWNER:
                v.owner_ring_epoch = -1  # route again by whatever ring we hold at the retry
        if back:
            # Back from a cut: what this batch did not acknowledge (a floor's usage among
            # it) goes again at the next flush, not after backed-off retries; until it is
            # applied the view subtracts it from what it may spend.
            self.link_reset(owner)
        return changed

    def tick(self, now_ns: int) -> None:
        """Expire views whose snapshot (or bootstrap) is older than the TTL."""
        unreachable_ns = self.config.owner_unreachable_ms * MS
        # Most live views are fresh: find the expired ones in one comprehension.
        for v in [v for v in self._live.values() if v.fresh_until_ns < now_ns]:
            key = v.key
            if v.state is SnapshotState.FRESH and self._still_vouched(v, now_ns):
                continue
            if v.unacked == 0 and not v.inflight:
                if key in self._retired:
                    self._drop(key)
                    continue
                self._boot(v, now_ns)  # idle: the owner has seen all of our usage
                del self._live[key]  # nothing to watch until it is used again
                continue
            if v.state is not SnapshotState.STALE:
                v.state = SnapshotState.STALE
                v.recompute()
            if self._serve_floor(v, now_ns):
                continue
            oldest = v.inflight[0].sent_at_ns if v.inflight else now_ns
            waited = now_ns - (v.fresh_until_ns - self.config.snapshot_ttl_ns)
            if (oldest >= 0 and now_ns - oldest > unreachable_ns) or waited > unreachable_ns:
                if v.no.suspended is not Suspension.OWNER_UNREACHABLE:  # once, not per tick
                    v.set_verdicts(
                        BOUNDS["global_stale"],
                        Suspension.OWNER_UNREACHABLE,
                        Reason.OWNER_UNREACHABLE,
                    )
            elif v.no.suspended is not Suspension.SNAPSHOT_STALE:
                v.set_verdicts(
                    BOUNDS["global_stale"], Suspension.SNAPSHOT_STALE, Reason.SNAPSHOT_STALE
                )

    def _serve_floor(self, v: GlobalGate, now_ns: int) -> bool:
        """Serve a stale view from its floor while its owner is unreachable; say whether it
        does. The floor (`shares.floor_ppm` of R per second: the share in the row held, at
        most 1 / ring members) opens once the owner has been silent for `floor_wait_ns` (by
        then it has found us silent for `escrow_after_ns` and escrows the floor), and lasts
        `partition_floor_ms`. Only a view whose row came from the key's owner in the ring,
        from its current incarnation and shortly before its last word, has one: the owner
        escrows exactly those (`mesh.core.owner._escrow`)."""
        cfg = self.config
        owner = v.snap_from
        heard = self._heard.get(owner, -1)
        # From our last word from the owner, or from our oldest unacknowledged report if it
        # is newer (a view with nothing unacknowledged has no floor, so a pause does not
        # count). The owner escrows from no later: from when it sent the newest batch we
        # confirmed receiving, or from what our reports said of this (`since_ages`).
        since = heard
        if v.inflight and v.inflight[0].created_ns > since:
            since = v.inflight[0].created_ns
        opens = since + cfg.floor_wait_ns
        st = self._vouch.get(owner)
        if not (
            cfg.partition_floor_ms > 0
            and heard >= 0
            and opens <= now_ns < opens + cfg.floor_ns
            and v.snap_at_ns >= heard - cfg.floor_recent_ns
            and st is not None
            and st.incarnation == v.snap_incarnation
            and self._idle_at.get(owner, -1) < self._acked_sent_at.get(owner, -1)
            and len(self.ring)
            and self.ring.owner_of(v.key) == owner
        ):
            if v.floor is not None:  # the span ran out, or the key moved: no floor now
                self._end_floor(v)
            return False
        if v.floor is None:
            policy = v.policy
            rate = policy.target_rate
            part = floor_ppm(v.snap_floor_ppm, len(self.ring))
            if part <= 0:
                return False
            burst = floor_burst(rate, part, cfg.reporter_lease_ms * MS, policy.local_burst_cap)
            at = max(0, now_ns) // PPM
            v.floor_ppm = part
            v.floor = Gcra(rate * part, burst, at)
            # It holds what the escrow charged before it opened, no more (`floor_start`).
            v.floor.apply(at, burst - floor_start(rate, part, cfg.escrow_after_ns, burst))
            v.floor_mark = v.unacked
            v.set_verdicts(BOUNDS["global_floor"], Suspension.OWNER_UNREACHABLE)
            self._floored.setdefault(owner, []).append(v)
        v.settle_floor(now_ns)
        return True

    @staticmethod
    def _end_floor(v: GlobalGate) -> None:
        """A view's floor ends: it is stale again (or fresh, if a row of it came)."""
        v.floor = None
        v.recompute()
        if v.state is SnapshotState.STALE:
            v.set_verdicts(BOUNDS["global_stale"], Suspension.SNAPSHOT_STALE, Reason.SNAPSHOT_STALE)

    def _vouched_by(self, owner: str, incarnation: int, seq: int, until_ns: int) -> None:
        """Note a batch numbered `seq` from `owner`: in order, it vouches for the views its
        earlier batches gave; after a gap, only for those from this batch on."""
        st = self._vouch.get(owner)
        if st is None or incarnation > st.incarnation:  # first word from this incarnation
            self._vouch[owner] = _Vouching(incarnation, seq, seq, until_ns)
        elif incarnation == st.incarnation and seq > st.last_batch:
            # After a gap (a batch is missing), what came before it may be out of date.
            first = seq if seq > st.last_batch + 1 else st.first_batch
            self._vouch[owner] = _Vouching(incarnation, seq, first, until_ns)
        # a batch older than the last one (reordered, repeated) vouches for nothing

    def _still_vouched(self, v: GlobalGate, now_ns: int) -> bool:
        """Whether the view's owner vouched for it within the TTL; if so, keep it fresh
        until that vouching lapses or the owner's lease on our reports of it does."""
        st = self._vouch.get(v.snap_from)
        if (
            st is None
            or st.until_ns <= now_ns
            or v.snap_batch < st.first_batch
            or v.snap_incarnation != st.incarnation
        ):
            return False
        lease_end = v.reported_at_ns + self.config.reporter_lease_ms * MS
        if lease_end <= now_ns:  # the owner no longer watches this key for us
            return False
        if not len(self.ring) or self.ring.owner_of(v.key) != v.snap_from:
            return False  # the key moved: only its new owner can speak for it
        v.fresh_until_ns = st.until_ns if st.until_ns < lease_end else lease_end
        return True

    def ring_changed(self, ring: Ring) -> None:
        """Adopt a new ring: in-flight reports go to the new owners with the same sequences."""
        moved = not ring.places_like(self.ring)
        self.ring = ring
        for owner in [o for o in self._vouch if o not in ring]:
            del self._vouch[owner]  # it owns nothing of ours now
        for owner in [o for o in self._floored if o not in ring]:
            del self._floored[owner]
        for owner in [o for o in self._heard if o not in ring]:
            del self._heard[owner]
        for owner in [o for o in self._reported_to if o not in ring]:
            del self._reported_to[owner]
        for owner in [o for o in self._acked_sent_at if o not in ring]:
            del self._acked_sent_at[owner]
            self._idle_at.pop(owner, None)
        self.ring_behind = max(self.ring_behind, ring.epoch)
        if not moved:
            return  # same members, same placement: every report is where it should be
        for v in self._unacked.values():
            for r in v.inflight:
                r.sent_at_ns = -1  # resend at the next flush, routed by the new ring
                r.sends = 0  # a new owner: timed afresh
            self._send_now[v.key] = v

    def link_reset(self, owner: str) -> None:
        """The stream to `owner` was re-established: what was written on the old one may be
        lost, so everything unacknowledged for it goes again at the next flush."""
        self.retry.forget(owner)
        for v in self._unacked.values():
            if v.owner == owner and v.inflight:
                for r in v.inflight:
                    r.sent_at_ns = -1
                    r.sends = 0
                self._send_now[v.key] = v

    def _schedule(self, v: GlobalGate, at_ns: int) -> None:
        if v.resend_at_ns != at_ns:
            v.resend_at_ns = at_ns
            self._due_seq += 1
            heappush(self._due, (at_ns, self._due_seq, v.key))

    def forget_if_idle(self, key: RateKey) -> bool:
        """Drop a view that holds nothing (bootstrap state, nothing pending or in flight,
        not watched by the tick). Returns whether it was dropped."""
        v = self.gates.get(key)
        if v is None:
            return True
        if (
            v.state is not SnapshotState.BOOT
            or v.pending
            or v.inflight
            or v.marked
            or key in self._live
        ):
            return False
        self._drop(key)
        return True

    def compact(self) -> None:
        """Give back the tables of the per-key maps after many views were dropped (a dict
        keeps its table at its largest size through deletions) and the ring's memoised
        lookups; `Admission`'s idle sweep calls this when a pass forgot more than it kept."""
        self.gates = dict(self.gates)
        self._live = dict(self._live)
        self._unacked = dict(self._unacked)
        self.ring.forget_lookups()  # the ring's memo holds the keys forgotten too

    def _drop(self, key: RateKey) -> None:
        v = self.gates.pop(key, None)
        if v is not None and v.next_sequence > self._sequence_from:
            self._sequence_from = v.next_sequence
        self._live.pop(key, None)
        self._unacked.pop(key, None)
        self._retired.discard(key)

    # -- introspection --------------------------------------------------------------------

    def oldest_unacked_ns(self, now_ns: int) -> int:
        """How long the oldest unacknowledged report has waited (0 if none)."""
        oldest = min(
            (r.sent_at_ns for v in self._unacked.values() for r in v.inflight if r.sent_at_ns >= 0),
            default=now_ns,
        )
        return now_ns - oldest

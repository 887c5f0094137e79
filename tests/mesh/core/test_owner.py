"""The owner: idempotent apply, conservative start, ownership and policy checks, snapshots."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.core.config import CoreConfig
from mesh.core.effects import Effect, FetchPolicy, Send
from mesh.core.gcra import Gcra
from mesh.core.messages import (
    REPORT_ROWS_MAX,
    RejectReason,
    ReportBatch,
    SnapshotBatch,
    UsageReport,
)
from mesh.core.owner import Owner
from mesh.core.owner._owner import FETCHING_MAX, OTHER_TENANT, SWEEP_SLICE
from mesh.core.policy import PolicyCache, RateKey, TenantRatePolicy
from mesh.core.ring import Ring
from tests.mesh._helpers import MS, cache, owned_policies, policy

# Every worker these tests report from, with the owner "o", in its ring: an owner takes
# reports from members only. Keys are chosen among those "o" holds there.
WORKERS = ("a", "b", "v", "w", "w0", "w1", "w2")


def ring_with(*more: str, epoch: int = 1) -> Ring:
    """The owner, every worker, and `more` members."""
    return Ring(["o", *WORKERS, *more], epoch)


RING = ring_with()


def mine(n: int, prefix: str = "t") -> list[TenantRatePolicy]:
    """`n` policies of keys the owner holds in RING."""
    return owned_policies(RING, "o", n, prefix)


P = policy(mine(1)[0].tenant_id, rate=1000, burst=100, b=20)
KEY = P.rate_key
LONG_AGO = 0
NOW = 10_000 * MS  # the owner has held its position for 10 s: keys may start full


def owner(
    ring: Ring | None = None, policies: PolicyCache | None = None, config: CoreConfig | None = None
) -> Owner:
    return Owner(
        "o",
        ring or RING,
        cache(P) if policies is None else policies,
        LONG_AGO,
        config=config,
    )


def batch(worker: str, *reports: UsageReport, epoch: int = 1) -> ReportBatch:
    return ReportBatch.of(worker, epoch, reports)


def rep(worker: str, seq: int, delta: int, epoch: int = 1, denied: int = 0) -> UsageReport:
    return UsageReport(KEY, worker, epoch, seq, iops_delta=delta, denied_delta=denied)


def snaps(effects: Sequence[Effect], to: str) -> SnapshotBatch:
    found = [e.message for e in effects if isinstance(e, Send) and e.to == to]
    assert len(found) == 1, effects
    assert isinstance(found[0], SnapshotBatch)
    return found[0]


def snapshot_batches(effects: Sequence[Effect], to: str | None = None) -> list[SnapshotBatch]:
    """The SnapshotBatches among `effects` (to one worker, or to all)."""
    return [
        e.message
        for e in effects
        if isinstance(e, Send)
        and isinstance(e.message, SnapshotBatch)
        and (to is None or e.to == to)
    ]


# -- idempotence -----------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[UsageReport], list[UsageReport]]:
    """Each worker's reports (one incarnation, sequences 1..n), and a hostile delivery order:
    any interleaving, with duplicates, reordering and replays."""
    workers = draw(st.integers(1, 3))
    reports = []
    for w in range(workers):
        n = draw(st.integers(0, 90))
        reports += [rep(f"w{w}", s, draw(st.integers(0, 9))) for s in range(1, n + 1)]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    delivered = [r for r in reports for _ in range(rng.choice([0, 1, 1, 2, 3]))]
    rng.shuffle(delivered)
    return reports, delivered


@pytest.mark.slow
@given(histories())
@settings(max_examples=200)
def test_any_interleaving_equals_applying_each_report_once(
    history: tuple[list[UsageReport], list[UsageReport]],
) -> None:
    reports, delivered = history
    # Everything arrives at one instant: a claim tolerance (`_plausible`) above it all.
    cfg = CoreConfig(report_retry_max_ms=1_000)
    o = owner(config=cfg)
    for r in delivered:  # the hostile network
        o.receive(NOW, batch(r.worker_id, r))
        # Never more than each report once, at any point.
        assert o.applied_units <= sum(x.iops_delta for x in reports)
    # Workers resend what is not acknowledged, oldest first, until it is.
    for w in sorted({r.worker_id for r in reports}):
        mine = [r for r in reports if r.worker_id == w]
        o.receive(NOW, batch(w, *mine))
    once = owner(config=cfg)
    for r in reports:
        once.receive(NOW, batch(r.worker_id, r))
    total = sum(r.iops_delta for r in reports)
    assert o.applied_units == once.applied_units == total
    if reports:
        assert o.keys[KEY].meter.tat_scaled == once.keys[KEY].meter.tat_scaled
        for w, rs in once.keys[KEY].reporters.items():
            assert o.keys[KEY].reporters[w].watermark == rs.watermark
            assert not o.keys[KEY].reporters[w].above


def test_newer_worker_epoch_resets_sequence_and_older_is_ignored() -> None:
    o = owner()
    o.receive(NOW, batch("w", rep("w", 1, 5), rep("w", 2, 5)))
    o.receive(NOW, batch("w", rep("w", 1, 7, epoch=2)))  # the worker restarted
    assert o.applied_units == 17
    o.receive(NOW, batch("w", rep("w", 3, 50, epoch=1)))  # a late report of the dead one
    assert o.applied_units == 17
    ack = snaps(o.receive(NOW, batch("w", rep("w", 1, 7, epoch=2))), "w").snapshots[0]
    assert (ack.receiver_epoch, ack.ack_sequence_for_receiver) == (2, 1)
    assert o.duplicates == 2


def test_beyond_the_reorder_window_is_not_applied_nor_acked() -> None:
    o = owner(config=CoreConfig(reorder_window=4))
    o.receive(NOW, batch("w", rep("w", 1, 1)))
    o.receive(NOW, batch("w", rep("w", 9, 1)))  # 8 past the ack: too far
    assert o.applied_units == 1
    o.receive(NOW, batch("w", rep("w", 3, 1)))  # within the window: applied, held above
    ack = snaps(o.receive(NOW, batch("w", rep("w", 2, 1))), "w").snapshots[0]
    assert ack.ack_sequence_for_receiver == 3 and o.applied_units == 3


# -- start, ownership, policy ------------------------------------------------------------------


def test_new_owner_starts_exhausted_and_refilling() -> None:
    # just took its ring position
    o = Owner("o", RING, cache(P), NOW)
    s = snaps(o.receive(NOW, batch("w", rep("w", 1, 0))), "w").snapshots[0]
    assert s.remaining == 0 and s.owner_epoch == 1
    later = snaps(o.receive(NOW + 50 * MS, batch("w", rep("w", 2, 0))), "w").snapshots[0]
    assert later.remaining == 50  # 50 ms at 1000/s
    assert later.order > s.order


def test_owner_that_held_its_position_long_enough_starts_full() -> None:
    o = owner()
    s = snaps(o.receive(NOW, batch("w", rep("w", 1, 10))), "w").snapshots[0]
    assert s.remaining == 90


def test_ring_change_restarts_the_conservative_window() -> None:
    o = owner(ring=RING)
    o.ring_changed(NOW, ring_with(epoch=2))
    s = snaps(o.receive(NOW, batch("w", rep("w", 1, 0), epoch=2)), "w").snapshots[0]
    assert s.remaining == 0 and s.owner_epoch == 2


def test_without_the_policy_the_owner_rejects_and_fetches_once() -> None:
    o = owner(policies=PolicyCache())
    effects = o.receive(NOW, batch("w", rep("w", 1, 3), rep("w", 2, 3)))
    fetches = [e for e in effects if isinstance(e, FetchPolicy)]
    assert fetches == [FetchPolicy(KEY)]
    rej = snaps(effects, "w").rejections
    assert [r.reason for r in rej] == [RejectReason.POLICY_UNKNOWN]
    assert o.applied_units == 0 and KEY not in o.keys
    assert not [e for e in o.receive(NOW, batch("w", rep("w", 1, 3))) if isinstance(e, FetchPolicy)]
    o.policies.put(P)
    o.policy_learned(KEY)
    o.receive(NOW, batch("w", rep("w", 1, 3)))
    assert o.applied_units == 3


def test_reports_for_keys_it_does_not_own_or_from_a_newer_ring_are_refused() -> None:
    ring = ring_with("p", epoch=3)
    me = ring.owner_of(KEY)
    other = "p" if me == "o" else "o"
    o = Owner(other, ring, cache(P), 0)
    rej = snaps(o.receive(NOW, batch("w", rep("w", 1, 3), epoch=3)), "w").rejections
    assert [(r.reason, r.ring_epoch) for r in rej] == [(RejectReason.NOT_OWNER, 3)]
    owns = Owner(me, ring, cache(P), 0)
    rej = snaps(owns.receive(NOW, batch("w", rep("w", 1, 3), epoch=4)), "w").rejections
    assert [r.reason for r in rej] == [RejectReason.STALE_EPOCH]
    assert o.applied_units == owns.applied_units == 0


# -- snapshots ------------------------------------------------------------------------------


def test_snapshots_go_only_to_active_reporters_and_stop_when_the_lease_ends() -> None:
    cfg = CoreConfig()
    o = owner(config=cfg)
    o.receive(NOW, batch("a", rep("a", 1, 1)))
    first_to_b = snaps(o.receive(NOW, batch("b", rep("b", 1, 1))), "b").batch_seq
    t = NOW + cfg.sync_interval_ms * MS
    effects = o.tick(t)
    # a's view lacks b's usage; b's reply already had everything: only a is behind.
    assert sorted(e.to for e in effects if isinstance(e, Send)) == ["a"]
    # Nothing changed since; b heard nothing for most of a TTL (two sync intervals short
    # of it): an empty batch vouches for the view it holds.
    t = NOW + (cfg.snapshot_ttl_ms - 2 * cfg.sync_interval_ms) * MS
    effects = o.tick(t)
    assert sorted(e.to for e in effects if isinstance(e, Send)) == ["b"]
    assert snaps(effects, "b").keys == () and snaps(effects, "b").batch_seq == first_to_b + 1
    later = o.tick(t + cfg.sync_interval_ms * MS)
    assert len(later) == 1 and snaps(later, "a").keys == ()  # and a's, one interval later
    o.receive(t, batch("a", rep("a", 2, 1)))  # only a keeps reporting
    t_end = NOW + (cfg.reporter_lease_ms + 1) * MS
    effects = o.tick(t_end)
    assert sorted(e.to for e in effects if isinstance(e, Send)) == ["a"]


def test_exhaustion_is_published_at_once_to_every_active_reporter() -> None:
    o = owner()
    o.receive(NOW, batch("a", rep("a", 1, 1)))
    o.receive(NOW, batch("b", rep("b", 1, 1)))
    effects = o.receive(NOW + MS, batch("a", rep("a", 2, 150)))  # past the burst
    to_b = snaps(effects, "b").snapshots[0]
    assert to_b.remaining == 0
    assert snaps(effects, "a").snapshots[0].remaining == 0


def test_full_batches_are_sent_at_once() -> None:
    cfg = CoreConfig(snapshot_batch_max=2)
    pols = mine(5)
    o = Owner("o", RING, cache(*pols), 0, config=cfg)
    reports = [UsageReport(p.rate_key, "w", 1, 1, iops_delta=1) for p in pols]
    effects = o.receive(NOW, ReportBatch.of("w", 1, reports))
    sizes = [len(m.snapshots) for m in snapshot_batches(effects)]
    assert sizes == [2, 2, 1]


def test_share_follows_demand_when_scarce_and_is_even_when_full() -> None:
    o = owner()
    o.receive(NOW, batch("a", rep("a", 1, 1)))
    o.receive(NOW, batch("b", rep("b", 1, 1)))
    full = snaps(o.receive(NOW, batch("a", rep("a", 2, 0))), "a").snapshots[0]
    assert full.active_reporters == 2 and 450_000 <= full.share_ppm <= 550_000
    o.receive(NOW, batch("a", rep("a", 3, 90, denied=300)))  # a is busy; the bucket empties
    scarce = snaps(o.receive(NOW, batch("a", rep("a", 4, 0))), "a").snapshots[0]
    other = snaps(o.receive(NOW, batch("b", rep("b", 2, 0))), "b").snapshots[0]
    assert scarce.share_ppm > 900_000 and scarce.share_ppm + other.share_ppm <= 1_000_000


def test_idle_full_keys_are_forgotten() -> None:
    cfg = CoreConfig(idempotency_retention_ms=100)
    o = owner(config=cfg)
    o.receive(NOW, batch("a", rep("a", 1, 100)))
    o.tick(NOW + 50 * MS)
    assert KEY in o.keys  # reporter remembered, bucket refilling
    o.tick(NOW + 200 * MS)
    assert KEY in o.keys  # the upkeep of quiet keys runs once a second
    o.tick(NOW + 1100 * MS)
    assert KEY not in o.keys


@pytest.mark.parametrize("delta", [1, 37])
def test_meter_matches_a_plain_gcra(delta: int) -> None:
    o = owner()
    g = Gcra(P.target_rate, P.global_burst, NOW)
    for i in range(1, 20):
        t = NOW + i * 3 * MS
        o.receive(t, batch("w", rep("w", i, delta)))
        g.apply(t, delta)
        assert o.keys[KEY].meter.remaining(t) == g.remaining(t)


def big(tenant: str = P.tenant_id) -> TenantRatePolicy:
    return policy(tenant, rate=1_000_000, burst=1_000_000, b=1000)


def test_a_refresh_goes_only_where_it_changes_what_a_reporter_may_spend() -> None:
    """Far from its limit, a key's reports change nothing the other reporters act on:
    they hear only empty batches, once per TTL; a draining bucket reaches them again."""
    cfg = CoreConfig()
    p = big()
    o = Owner("o", RING, cache(p), 0, config=cfg)
    key = p.rate_key
    t = NOW
    o.receive(t, ReportBatch.of("a", 1, [UsageReport(key, "a", 1, 1, iops_delta=1)]))
    o.receive(t, ReportBatch.of("b", 1, [UsageReport(key, "b", 1, 1, iops_delta=1)]))
    o.tick(t + 5 * MS)  # a learns that b joined (its cap halves)
    to_b: list[SnapshotBatch] = []
    for i in range(2, 12):  # a reports every 5 ms, b only once in a while
        t = NOW + 5 * i * MS
        o.receive(t, ReportBatch.of("a", 1, [UsageReport(key, "a", 1, i, iops_delta=10)]))
        if i % 6 == 0:
            o.receive(t, ReportBatch.of("b", 1, [UsageReport(key, "b", 1, i, iops_delta=1)]))
        to_b += snapshot_batches(o.tick(t), "b")
    assert to_b and all(m.keys == () for m in to_b)  # heartbeats only
    # a drains the bucket: what b may spend changes, and b hears of it at the next tick.
    t += 5 * MS
    o.receive(t, ReportBatch.of("a", 1, [UsageReport(key, "a", 1, 12, iops_delta=999_000)]))
    rows = [r for m in snapshot_batches(o.tick(t + 5 * MS), "b") for r in m.snapshots]
    assert [r.rate_key for r in rows] == [key] and rows[0].remaining < 10_000


def test_batches_to_a_worker_are_numbered_and_moved_keys_skip_a_number() -> None:
    ring = ring_with("x", epoch=2)
    pols = mine(50)
    stays = next(p for p in pols if ring.owner_of(p.rate_key) == "o")
    moves = next(p for p in pols if ring.owner_of(p.rate_key) == "x")
    o = Owner("o", RING, cache(stays, moves), 0)
    first, second = (
        snaps(o.receive(NOW, batch_of("a", p.rate_key, 1)), "a").batch_seq for p in (stays, moves)
    )
    assert second == first + 1
    o.ring_changed(NOW, ring)  # a key moved to x: a's views of it must not be vouched for
    third = snaps(o.receive(NOW, batch_of("a", stays.rate_key, 2, epoch=2)), "a").batch_seq
    assert third == second + 2


def test_a_forgotten_worker_is_numbered_past_anything_it_had_from_us() -> None:
    cfg = CoreConfig(idempotency_retention_ms=100)
    o = owner(config=cfg)
    before = snaps(o.receive(NOW, batch("a", rep("a", 1, 1))), "a").batch_seq
    o.tick(NOW + 1100 * MS)  # the upkeep, once a second: a is long gone
    after = snaps(o.receive(NOW + 1200 * MS, batch("a", rep("a", 2, 1))), "a").batch_seq
    assert after > before + 1  # a gap: nothing a held from before is vouched for


def batch_of(worker: str, key: RateKey, seq: int, epoch: int = 1) -> ReportBatch:
    return ReportBatch.of(worker, epoch, [UsageReport(key, worker, 1, seq, iops_delta=1)])


def test_per_key_applied_shrinks_with_the_keys_the_owner_forgets() -> None:
    """A soak of many distinct keys: the per-key telemetry (`Owner.applied`, which a
    hand-over also reads) follows the keys the owner holds, not every key it ever metered."""
    cfg = CoreConfig(idempotency_retention_ms=100)
    pols = mine(2000)
    o = Owner("o", RING, cache(*pols), 0, config=cfg)

    def touch(now_ns: int, seq: int) -> None:
        for i in range(0, len(pols), 250):
            o.receive(
                now_ns,
                ReportBatch.of(
                    "w",
                    1,
                    [UsageReport(p.rate_key, "w", 1, seq, iops_delta=3) for p in pols[i : i + 250]],
                ),
            )

    touch(NOW, 1)
    assert len(o.applied) == len(o.keys) == 2000
    assert set(o.applied.values()) == {3} and o.applied_units == 6000
    sweep_pass(o, NOW + 1100 * MS)  # idle past retention, buckets full: the upkeep forgets them
    assert not o.keys and not o.applied
    assert o.applied_units == 6000  # the owner's total stays
    # The per-scope telemetry counter never goes down: forgotten keys are folded into it.
    assert sum(o.applied_by_scope().values()) == 6000
    # Touched again, then half the keys move away with a ring change.
    touch(NOW + 1200 * MS, 2)
    assert set(o.applied.values()) == {3}  # counted from the key's (re)opening
    ring = ring_with("x", epoch=2)
    o.ring_changed(NOW + 1200 * MS, ring)
    stays = {p.rate_key for p in pols if ring.owner_of(p.rate_key) == "o"}
    assert 0 < len(stays) < 2000
    assert set(o.applied) == set(o.keys) == stays
    by_scope = o.applied_by_scope()
    assert sum(by_scope.values()) == 12000
    # The retained keys each have their scope; the forgotten and moved ones fold into one
    # OTHER_TENANT total per metric.
    retired = {s for s in by_scope if s[0] not in {k.tenant_id for k in stays}}
    assert retired == {(OTHER_TENANT, p.metric) for p in pols}
    assert len(by_scope) == len(stays) + len(retired)


def test_fetches_in_flight_are_bounded_and_the_rest_refused_without_one() -> None:
    """One batch of many unknown keys asks for at most FETCHING_MAX generations;
    every unknown key is refused POLICY_UNKNOWN; an answered fetch frees its place."""
    o = owner(policies=PolicyCache())
    keys = [p.rate_key for p in mine(FETCHING_MAX + 100, prefix="u")]
    n = len(keys)

    def receive() -> list[Effect]:
        """The keys' reports, in batches of the largest size."""
        out: list[Effect] = []
        for i in range(0, n, REPORT_ROWS_MAX):
            ks = tuple(keys[i : i + REPORT_ROWS_MAX])
            m = len(ks)
            out += o.receive(
                NOW, ReportBatch("w", 1, 1, ks, (1,) * m, (1,) * m, (0,) * m, (1,) * m)
            )
        return out

    effects = receive()
    fetched = [e.rate_key for e in effects if isinstance(e, FetchPolicy)]
    assert fetched == keys[:FETCHING_MAX]
    rejected = [r for s in snapshot_batches(effects, "w") for r in s.rejections]
    assert len(rejected) == n
    assert {r.reason for r in rejected} == {RejectReason.POLICY_UNKNOWN}
    assert not [e for e in receive() if isinstance(e, FetchPolicy)]  # all in flight
    o.policy_learned(keys[0])
    again = [e.rate_key for e in receive() if isinstance(e, FetchPolicy)]
    assert again == [keys[0]] and len(o._fetching) == FETCHING_MAX
    for k in keys:
        o.policy_learned(k)
    assert not o._fetching and not o.keys


def test_the_upkeep_visits_at_most_a_slice_of_keys_per_tick_and_resumes() -> None:
    """An owner holding many keys spreads a pass of its upkeep over ticks,
    SWEEP_SLICE keys a tick, resuming where it stopped; keys opened meanwhile, kept keys
    and keys that moved away are each handled once per pass."""
    cfg = CoreConfig(idempotency_retention_ms=100)
    n = 3 * SWEEP_SLICE + 5
    pols = mine(n + 10)
    o = Owner("o", RING, cache(*pols), 0, config=cfg)
    for i in range(0, n, REPORT_ROWS_MAX):
        rows = [rep_of(p, "w", 1) for p in pols[i : min(i + REPORT_ROWS_MAX, n)]]
        o.receive(NOW, ReportBatch.of("w", 1, rows))
    assert len(o.keys) == n
    t = NOW + 1100 * MS  # idle past retention and full: every key may go
    late = pols[n]
    o.tick(t)
    assert len(o.keys) == n - SWEEP_SLICE
    o.receive(t, ReportBatch.of("v", 1, [rep_of(late, "v", 1)]))  # opened during the pass
    for k in range(2, 5):
        o.tick(t + k * MS)
        assert len(o.keys) == max(n - k * SWEEP_SLICE, 0) + 1
    assert list(o.keys) == [late.rate_key] and len(o._sweep_order) == 1
    o.tick(t + 10 * MS)  # the pass is over: nothing visited until the next one
    assert list(o.keys) == [late.rate_key]
    o.tick(t + 1200 * MS)  # the next pass: v's record is past retention too
    assert not o.keys and not o._sweep_order


def test_a_pass_of_the_upkeep_drops_the_entries_of_keys_that_moved() -> None:
    pols = mine(200)
    o = owner(policies=cache(*pols))
    o.receive(NOW, ReportBatch.of("w", 1, [rep_of(p, "w", 1) for p in pols]))
    o.ring_changed(NOW, ring_with("x", epoch=2))
    kept = len(o.keys)
    assert 0 < kept < 200 and len(o._sweep_order) == 200
    o.tick(NOW + 1100 * MS)  # reporters within retention: the kept keys stay
    assert len(o._sweep_order) == len(o.keys) == kept


def sweep_pass(o: Owner, now_ns: int) -> int:
    """Tick every sync interval from `now_ns` until a pass of the upkeep is over."""
    o.tick(now_ns)
    while o._sweep_left:
        now_ns += o.config.sync_interval_ms * MS
        o.tick(now_ns)
    return now_ns


def rep_of(p: TenantRatePolicy, worker: str, seq: int) -> UsageReport:
    return UsageReport(p.rate_key, worker, 1, seq, iops_delta=1)


def test_each_field_of_a_snapshot_row_lands_in_the_batch_column_of_its_name() -> None:
    """`Owner._row` builds a row in the order `_message` names its columns: a row of
    distinct values comes out of the SnapshotBatch one value per column, in that order."""
    o = owner()
    assert o.escrows.on()  # floors_ppm is sent (with floors off it is left empty)
    row = (KEY, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
    send = o._message("a", NOW, [row], [])
    m = send.message
    assert isinstance(m, SnapshotBatch)
    columns = (
        m.keys,
        m.owner_epochs,
        m.versions,
        m.remaining,
        m.acks,
        m.receiver_epochs,
        m.shares_ppm,
        m.active_reporters,
        m.floors_ppm,
        m.applied_above,
        m.applied_net,
    )
    assert columns == tuple((v,) for v in row)
    # A reply's row (inlined in `_reply`) is the row `_row` makes of the same state: the
    # same fields in the same order, but the version, which `_row` moves on once more.
    for worker, n in (("a", 1), ("b", 2)):
        s = snaps(o.receive(NOW, batch(worker, rep(worker, 1, 3))), worker)
        ks = o.keys[KEY]
        again = o._row(
            NOW,
            KEY,
            ks,
            ks.reporters[worker],
            worker,
            s.remaining[0],
            ks.reporters[worker].sent_floor,
            s.shares_ppm[0],
            n,
            False,
        )
        reply = next(
            zip(
                s.keys,
                s.owner_epochs,
                s.versions,
                s.remaining,
                s.acks,
                s.receiver_epochs,
                s.shares_ppm,
                s.active_reporters,
                s.floors_ppm,
                s.applied_net,
                strict=True,
            )
        )
        assert again[2] == reply[2] + 1
        assert again[:2] + again[3:8] == reply[:2] + reply[3:8]
        assert again[9] == 0 and not s.applied_above and again[10] == reply[9]

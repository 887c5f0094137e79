"""The worker side: effective availability, bootstrap, TTL, retries, thresholds, refunds."""

from __future__ import annotations

from collections.abc import Sequence

from mesh.core.admission import Admission
from mesh.core.config import CoreConfig
from mesh.core.effects import Effect, Send
from mesh.core.messages import RateSnapshot, ReportBatch, SnapshotBatch, UsageReport
from mesh.core.policy import PolicyCache, TenantRatePolicy
from mesh.core.reporter import GlobalGate, Reporter, SnapshotState
from mesh.core.ring import Ring
from mesh.core.shares import PPM
from mesh.core.verdict import Reason, Suspension
from tests.mesh._helpers import MS, cache, policy

P = policy("t", rate=1000, burst=100, b=40)
KEY = P.rate_key


def worker(
    n_members: int = 4, policies: PolicyCache | None = None, config: CoreConfig | None = None
) -> tuple[Reporter, Admission]:
    ring = Ring(["w"] + [f"o{i}" for i in range(n_members - 1)], 1)
    r = Reporter("w", 7, ring, config=config)
    return r, Admission(policies or cache(P), 0, reporter=r, config=config)


def snap(
    remaining: int,
    ack: int,
    version: int,
    share_ppm: int = PPM,
    active: int = 1,
    key: object = KEY,
    epoch: int = 7,
) -> SnapshotBatch:
    return SnapshotBatch.of(
        "o",
        1,
        (
            RateSnapshot(
                key,  # type: ignore[arg-type]
                1,
                version,
                remaining,
                0,
                ack,
                epoch,
                0,
                share_ppm,
                active,
            ),
        ),
    )


def sent_reports(effects: Sequence[Effect]) -> list[UsageReport]:
    return [
        r
        for e in effects
        if isinstance(e, Send) and isinstance(e.message, ReportBatch)
        for r in e.message.reports
    ]


def admit_n(a: Admission, n: int, tenant: str = "t") -> int:
    return sum(a.try_admit(tenant, "read_iops").allowed for _ in range(n))


def test_bootstrap_allowance_is_b_over_n_not_the_global_burst() -> None:
    r, a = worker(n_members=4)
    assert admit_n(a, 100) == 10  # ceil(40 / 4)
    v = a.gate("t", "read_iops")
    assert isinstance(v, GlobalGate) and v.state is SnapshotState.BOOT


def test_effective_availability_subtracts_unacknowledged_use() -> None:
    r, a = worker()
    admit_n(a, 5)
    [rep] = sent_reports(r.flush(0))
    assert (rep.sequence, rep.iops_delta) == (1, 5)
    admit_n(a, 3)  # pending, not yet reported
    # A snapshot that does not yet reflect report 1: remaining 30 - unacked (5 + 3).
    r.receive(1 * MS, snap(30, 0, 1))
    v = a.gate("t", "read_iops")
    assert isinstance(v, GlobalGate) and v.avail == 30 - 8
    # The owner applied report 1: remaining already includes it, so only 3 are subtracted.
    r.receive(2 * MS, snap(25, 1, 2))
    assert v.avail == 25 - 3 and not v.inflight


def test_older_or_foreign_snapshots_are_ignored() -> None:
    r, a = worker()
    admit_n(a, 1)
    r.receive(1 * MS, snap(30, 0, 5))
    v = a.gate("t", "read_iops")
    assert v is not None and v.avail == 29
    r.receive(2 * MS, snap(99, 0, 4))  # reordered: older version
    r.receive(2 * MS, snap(99, 0, 6, epoch=6))  # addressed to an earlier incarnation
    assert v.avail == 29


def test_allowance_is_the_share_of_remaining_capped_by_the_local_burst() -> None:
    r, a = worker()
    admit_n(a, 1)
    a.gate("t", "read_iops")
    r.receive(MS, snap(1000, 0, 1, share_ppm=PPM // 4, active=4))
    v = a.gate("t", "read_iops")
    assert isinstance(v, GlobalGate)
    assert v.allowance == 10  # b / active = 40 / 4, less than a quarter of 1000
    r.receive(2 * MS, snap(20, 0, 2, share_ppm=PPM // 4, active=4))
    assert v.allowance == 1 + (20 - 4) // 4  # a quarter of what remains, one unit each first


def test_stale_view_admits_nothing_new_then_says_owner_unreachable() -> None:
    cfg = CoreConfig()
    r, a = worker(config=cfg)
    admit_n(a, 1)
    r.flush(0)
    r.receive(0, snap(100, 0, 1))
    assert admit_n(a, 5) == 5
    r.flush(MS)
    a.tick((cfg.snapshot_ttl_ms + 1) * MS)
    v = a.try_admit("t", "read_iops")
    assert not v.allowed and v.suspended is Suspension.SNAPSHOT_STALE
    assert v.reason is Reason.SNAPSHOT_STALE and v.bound.startswith("excess<=N*b+R*d")
    a.tick((cfg.owner_unreachable_ms + 5) * MS)
    v = a.try_admit("t", "read_iops")
    assert not v.allowed and v.suspended is Suspension.OWNER_UNREACHABLE
    # The owner answers at last: the view is fresh again and admits.
    r.receive(200 * MS, snap(100, 2, 2))
    assert a.try_admit("t", "read_iops").allowed


def test_an_idle_view_returns_to_bootstrap_instead_of_going_stale() -> None:
    cfg = CoreConfig()
    r, a = worker(config=cfg)
    admit_n(a, 2)
    r.flush(0)
    r.receive(MS, snap(100, 1, 1))  # everything acknowledged
    a.tick(100 * MS)
    v = a.gate("t", "read_iops")
    assert isinstance(v, GlobalGate) and v.state is SnapshotState.BOOT
    assert a.try_admit("t", "read_iops").allowed


def test_unacknowledged_reports_are_resent_with_the_same_epoch_and_sequence() -> None:
    cfg = CoreConfig()
    r, a = worker(config=cfg)
    admit_n(a, 3)
    first = sent_reports(r.flush(0))
    assert sent_reports(r.flush(MS)) == []  # not yet due
    again = sent_reports(r.flush((cfg.report_retry_ms + 1) * MS))
    assert (
        [(x.worker_epoch, x.sequence, x.iops_delta) for x in again]
        == [(x.worker_epoch, x.sequence, x.iops_delta) for x in first]
        == [(7, 1, 3)]
    )
    r.receive(20 * MS, snap(50, 1, 1))
    assert sent_reports(r.flush(100 * MS)) == []


def test_a_new_ring_resends_in_flight_reports_to_the_new_owner() -> None:
    r, a = worker(n_members=1)
    admit_n(a, 3)
    assert {e.to for e in r.flush(0) if isinstance(e, Send)} == {"w"}
    r.ring_changed(Ring(["x"], 2))
    effects = r.flush(MS)
    assert [(e.to, e.message.ring_epoch) for e in effects if isinstance(e, Send)] == [("x", 2)]
    assert [x.sequence for x in sent_reports(effects)] == [1]


def test_threshold_wakes_the_driver_once() -> None:
    r, a = worker()
    woken = []
    r.wake = lambda: woken.append(1)
    r.receive(0, snap(10**6, 0, 1))
    admit_n(a, 1)
    r.receive(0, snap(10**6, 0, 2))
    big = TenantRatePolicy("t", "read_iops", 1, 10**6, 10**6, 10**6)  # type: ignore[arg-type]
    r2, a2 = worker(policies=cache(big))
    r2.wake = lambda: woken.append(2)
    admit_n(a2, 1)
    r2.receive(0, snap(10**6, 0, 1))
    admit_n(a2, 40)
    assert woken == [2]  # crossed 32 units once
    assert [x.iops_delta for x in sent_reports(r2.flush(MS))] == [41]


def test_byte_refund_is_carried_as_a_correction_in_a_later_report() -> None:
    bp = policy("t", metric="client_egress_bytes", rate=10**9, burst=10**7, b=4 << 20)
    r, a = worker(n_members=1, policies=cache(bp))
    assert a.charge("t", "client_egress_bytes", 1 << 20).allowed
    [rep] = sent_reports(r.flush(0))
    assert rep.byte_delta == 1 << 20 and rep.iops_delta == 0
    a.refund("t", "client_egress_bytes", 300_000)  # the send was short
    v = a.gate("t", "client_egress_bytes")
    assert v is not None and v.avail == (4 << 20) - (1 << 20) + 300_000
    [correction] = sent_reports(r.flush(MS))  # report 1 is not due for a resend yet
    assert correction.byte_delta == -300_000 and correction.sequence == 2


def test_policy_generation_change_retires_the_old_key_after_it_drains() -> None:
    pc = cache(P)
    r, a = worker(policies=pc)
    admit_n(a, 2)
    r.flush(0)
    pc.put(policy("t", rate=2000, burst=100, b=40, gen=2))
    a.tick(MS)
    v2 = a.gate("t", "read_iops")
    assert v2 is not None and v2.policy.generation == 2
    assert KEY in r.gates  # still owes a report
    r.receive(2 * MS, snap(50, 1, 1))
    a.tick(100 * MS)
    assert KEY not in r.gates


def test_resends_back_off_and_the_timeout_follows_the_owner() -> None:
    from mesh.core.reporter._rto import RetryTimer

    t = RetryTimer(15 * MS, 50 * MS)
    assert t.timeout_ns("o") == 15 * MS  # nothing measured yet: the minimum
    for _ in range(20):
        t.sample("o", 2 * MS)
    assert t.timeout_ns("o") == 15 * MS  # a fast owner never goes below the minimum
    for _ in range(40):
        t.sample("slow", 30 * MS)
    assert 30 * MS < t.timeout_ns("slow") <= 50 * MS  # a slow owner is given longer
    backoffs = []
    for at in (1, 2, 2, 3, 4):  # a timeout fired at each (twice at 2: counted once)
        t.fired("o", at * MS)
        backoffs.append(t.timeout_ns("o"))
    assert backoffs == [30 * MS, 50 * MS, 50 * MS, 50 * MS, 50 * MS]  # doubled, capped
    t.sample("o", 2 * MS)  # a clean sample ends the back-off
    assert t.timeout_ns("o") == 15 * MS


def test_a_report_is_resent_at_doubling_intervals_and_only_clean_acks_are_timed() -> None:
    cfg = CoreConfig(report_retry_max_ms=50)
    r, a = worker(config=cfg)
    admit_n(a, 3)
    owner = r.ring.owner_of(KEY)
    assert len(sent_reports(r.flush(0))) == 1
    assert sent_reports(r.flush(14 * MS)) == []
    assert len(sent_reports(r.flush(15 * MS))) == 1  # first resend after the minimum
    assert sent_reports(r.flush(44 * MS)) == []  # the second waits twice as long
    assert len(sent_reports(r.flush(45 * MS))) == 1
    assert r.resent == 2
    r.receive(46 * MS, SnapshotBatch.of(owner, 1, (RateSnapshot(KEY, 1, 1, 50, 0, 1, 7),)))
    # An ack of a resent report is no sample (Karn): the backed-off timeout stays.
    assert r.retry.timeout_ns(owner) == 50 * MS
    admit_n(a, 1)
    r.flush(50 * MS)
    r.receive(52 * MS, SnapshotBatch.of(owner, 1, (RateSnapshot(KEY, 1, 2, 50, 0, 2, 7),)))
    assert owner in r.retry._srtt and r.retry._srtt[owner] == 2 * MS
    assert r.retry.timeout_ns(owner) == 15 * MS  # a clean sample ends the back-off


def test_a_reset_link_resends_what_its_owner_has_not_acknowledged_at_once() -> None:
    cfg = CoreConfig(report_retry_max_ms=1000)
    r, a = worker(config=cfg)
    admit_n(a, 3)
    owner = r.ring.owner_of(KEY)
    assert len(sent_reports(r.flush(0))) == 1
    assert sent_reports(r.flush(5 * MS)) == []  # no news yet, and no resend
    r.link_reset("somebody-else")
    assert sent_reports(r.flush(6 * MS)) == []
    r.link_reset(owner)  # the stream reopened: what it carried may be lost
    again = sent_reports(r.flush(7 * MS))
    assert [(x.sequence, x.iops_delta) for x in again] == [(1, 3)]


def vouching(r: Reporter, seq: int, *rows: RateSnapshot, inc: int = 0) -> SnapshotBatch:
    """A batch from the key's owner, numbered `seq` (empty: it only vouches)."""
    owner = r.ring.owner_of(KEY)
    return (
        SnapshotBatch.of(owner, 1, rows, batch_seq=seq)
        if rows
        else SnapshotBatch(owner, 1, inc, batch_seq=seq)
    )


def row(version: int, ack: int) -> RateSnapshot:
    return RateSnapshot(KEY, 1, version, 100, 0, ack, 7, 0, PPM, 1)


def fresh_view_at_1ms() -> tuple[Reporter, Admission, GlobalGate]:
    r, a = worker()
    admit_n(a, 2)
    r.flush(0)  # the owner's lease on our reports of the key runs 50 ms from here
    r.receive(MS, vouching(r, 1, row(1, 1)))  # fresh until 21 ms
    v = a.gate("t", "read_iops")
    assert isinstance(v, GlobalGate) and v.state is SnapshotState.FRESH
    return r, a, v


def test_an_owners_later_batches_keep_its_views_fresh_while_the_lease_lasts() -> None:
    r, a, v = fresh_view_at_1ms()
    r.receive(15 * MS, vouching(r, 2))
    a.tick(25 * MS)
    assert v.state is SnapshotState.FRESH and v.allowance == 40
    r.receive(30 * MS, vouching(r, 3))
    a.tick(45 * MS)
    assert v.state is SnapshotState.FRESH
    a.tick(55 * MS)  # we sent no report for 50 ms: the owner stopped watching the key for us
    assert v.state is SnapshotState.BOOT  # type: ignore[comparison-overlap]  # tick changed it


def test_a_missing_batch_number_ends_the_vouching_for_what_came_before() -> None:
    r, a, v = fresh_view_at_1ms()
    r.receive(15 * MS, vouching(r, 3))  # batch 2 was lost: it may have changed this view
    a.tick(25 * MS)
    assert v.state is SnapshotState.BOOT


def test_only_the_keys_owner_in_its_own_incarnation_vouches() -> None:
    r, a, v = fresh_view_at_1ms()
    r.receive(15 * MS, vouching(r, 1, inc=1))  # the owner restarted: it knows nothing of v
    a.tick(25 * MS)
    assert v.state is SnapshotState.BOOT
    r, a, v = fresh_view_at_1ms()
    r.receive(15 * MS, vouching(r, 2))
    r.ring_changed(Ring(["w", "z"], 2))  # the key has another owner now
    a.tick(25 * MS)
    assert v.state is SnapshotState.BOOT

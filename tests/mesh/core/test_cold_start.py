"""Cold keys under a flash crowd: a full bucket that demand is draining is shared
by demand (`shares.plenty`), in the owner's tick and reply alike, and a bootstrap view's
first report goes as soon as its bootstrap allowance is spent.

The randomized tests take their seed from the parametrization and name it in every
assertion message, so a failure replays with `-k 'seed-N'`.
"""

from __future__ import annotations

import random

import pytest

from mesh.core.admission import Admission
from mesh.core.config import CoreConfig
from mesh.core.effects import Effect, Send
from mesh.core.member import Member
from mesh.core.messages import RateSnapshot, ReportBatch, SnapshotBatch, UsageReport
from mesh.core.owner import KeyState, Owner
from mesh.core.policy import RateKey
from mesh.core.reporter import GlobalGate, Reporter, SnapshotState
from mesh.core.ring import Ring
from mesh.core.shares import (
    DEMAND_PART,
    OVERLOAD,
    PPM,
    plenty,
    refill_units,
    share_basis,
    share_ppm,
    shares_even,
    snapshot_allowance_ppm,
)
from tests.mesh._helpers import MS, cache, owned_policies, policy

NOW = 10_000 * MS  # the owner has held its position long enough for keys to start full
FLOOR = CoreConfig().share_floor_ppm
SEEDS = range(12)


# -- the formula ---------------------------------------------------------------------------


def test_a_full_bucket_is_plenty_until_demand_reaches_a_part_of_it() -> None:
    assert DEMAND_PART >= 1
    assert plenty(100, 0) and plenty(100, (100 - 1) // DEMAND_PART)
    assert not plenty(100, 100 // DEMAND_PART) and not plenty(100, 10_000)
    assert not plenty(0, 0)  # an empty bucket is never plenty (its even part is the floor)


def test_demand_below_the_rate_leaves_a_full_bucket_plenty() -> None:
    """noisy-neighbour's quiet tenant: rate 500, burst 50, demand in lumps. Thirteen units
    over a 30 ms span reach a quarter of the bucket but not what the rate refills over the
    span (15): the bucket is not being drained, and the split stays even."""
    refill = refill_units(500, 30 * MS)
    assert refill == 15
    assert plenty(50, 13, refill) and not plenty(50, 13)
    assert not plenty(50, OVERLOAD * refill, refill)  # at the rate and a quarter: drained
    assert refill_units(500, 0) == refill_units(500, -MS) == 0


def test_a_drained_full_bucket_goes_where_the_requests_are() -> None:
    """Flash-crowd numbers: 12 reporters, a full bucket, Zipf 1.5 demand. While
    the demand is small beside the bucket the split is even; once it reaches a quarter of
    it, the busiest reporter's share, and what a row lets it spend, are several times the
    even one's, and the shares still sum to at most one."""
    weights = [(i + 1) ** -1.5 for i in range(12)]
    b, remaining, burst = 50, 100, 100
    for total, even in ((8, True), (40, False)):
        demands = [round(total * w / sum(weights)) for w in weights]
        basis = share_basis(remaining, burst, FLOOR, 12, sum(demands))
        assert shares_even(basis) is even
        shares = [share_ppm(basis, d) for d in demands]
        assert sum(shares) <= PPM
        allowances = [snapshot_allowance_ppm(remaining, s, 12, b) for s in shares]
        assert sum(allowances) <= remaining * PPM
        if even:
            assert len(set(shares)) == 1
        else:
            assert shares[0] > 4 * min(shares)
            assert allowances[0] >= 4 * (b * PPM // 12)  # not b / N: 4x that at least


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed-{s}")
def test_shares_sum_to_at_most_one_on_both_sides_of_plenty(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        burst = rng.choice([rng.randint(1, 200), rng.randint(1, 10**9)])
        remaining = rng.randint(0, burst)
        n = rng.randint(1, 40)
        edge = remaining // DEMAND_PART
        demands = [rng.randint(0, max(1, 2 * edge // n + 1)) for _ in range(n)]
        basis = share_basis(remaining, burst, rng.randint(1, PPM), n, sum(demands))
        shares = [share_ppm(basis, d) for d in demands]
        assert sum(shares) <= PPM, (seed, burst, remaining, demands)
        if not plenty(remaining, sum(demands)) and not shares_even(basis):
            busiest = max(range(n), key=lambda i: demands[i])
            assert shares[busiest] == max(shares), (seed, burst, remaining, demands)


# -- the owner: its reply and its tick both use it -----------------------------------------


WORKERS_MAX = 12  # the most workers a test here reports from


def _owner(b: int = 50, burst: int = 100) -> tuple[Owner, RateKey]:
    # The owner's ring holds the workers that report to it (it refuses anyone else).
    ring = Ring(["o", *(f"w{i}" for i in range(WORKERS_MAX))], 1)
    [p] = owned_policies(ring, "o", 1, rate=10 * burst, burst=burst, b=b)  # refills in 100 ms
    o = Owner("o", ring, cache(p), 0)
    return o, p.rate_key


def _report(
    o: Owner, now_ns: int, key: RateKey, worker: str, seq: int, used: int, denied: int
) -> list[Effect]:
    report = UsageReport(key, worker, 1, seq, iops_delta=used, denied_delta=denied)
    return o.receive(now_ns, ReportBatch.of(worker, 1, [report]))


def _rows(effects: list[Effect], to: str | None = None) -> list[tuple[str, RateSnapshot]]:
    return [
        (e.to, row)
        for e in effects
        if isinstance(e, Send) and isinstance(e.message, SnapshotBatch)
        if to is None or e.to == to
        for row in e.message.snapshots
    ]


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed-{s}")
def test_the_reply_and_the_tick_share_as_the_helpers_say(seed: int) -> None:
    """Random reporters and demands around the edge of `plenty`: every row the reply and the
    next tick send carries the share `share_basis`/`share_ppm` give for the key's state then."""
    rng = random.Random(seed)
    o, key = _owner()
    n = rng.randint(2, 12)
    workers = [f"w{i}" for i in range(n)]
    start = NOW - rng.choice([0, 3, 30, 300]) * MS  # the key's age: the demand's span
    _report(o, start, key, "w0", 1, 0, 0)
    for w in workers:
        _report(o, NOW, key, w, 1 + (w == "w0"), rng.randint(0, 4), rng.randint(0, 15))
    ks = o.keys[key]

    def expect(worker: str, now_ns: int) -> int:
        active, total = o._live_demand(now_ns, ks)
        span_ns = ks.demand_span_ns(now_ns, CoreConfig().demand_window_ms * MS)
        refill = refill_units(ks.meter.rate, span_ns)
        remaining = ks.meter.remaining(now_ns)
        basis = share_basis(remaining, ks.meter.burst, FLOOR, active, total, refill)
        rs = ks.reporters[worker]
        return share_ppm(basis, rs.demand_cur + rs.demand_prev)

    sender = rng.choice(workers)
    seq = 3 if sender == "w0" else 2
    effects = _report(o, NOW + MS, key, sender, seq, rng.randint(0, 3), rng.randint(0, 30))
    [(_, row)] = _rows(effects, sender)
    assert row.share_ppm == expect(sender, NOW + MS), seed
    later = NOW + 7 * MS
    for to, row in _rows(o.tick(later)):
        assert row.share_ppm == expect(to, later), (seed, to)


def test_a_cold_key_under_a_skewed_crowd_gives_its_busiest_reporter_a_demand_share() -> None:
    """Twelve workers meet a cold key; the load balancer gives w0 about half the requests,
    and its bootstrap allowance ran out (denials). The rows of the next tick give it several
    times an even share of what a row may hand out, and the fleet's rows never add up to
    more than remains."""
    o, key = _owner(b=50)
    weights = [(i + 1) ** -1.5 for i in range(12)]
    rows: dict[str, RateSnapshot] = {}  # the newest row each worker holds
    for i, w in enumerate(weights):
        offered = round(60 * w / sum(weights))
        used = min(offered, 5)
        rows.update(_rows(_report(o, NOW, key, f"w{i}", 1, used, offered - used)))
    ks: KeyState = o.keys[key]
    remaining = ks.meter.remaining(NOW + 5 * MS)
    assert remaining >= 50  # the bucket is still more than half full
    ticked = dict(_rows(o.tick(NOW + 5 * MS)))
    assert len(ticked) >= 11  # every reporter whose row the crowd changed is told
    rows.update(ticked)
    assert len(rows) == 12 and all(r.active_reporters == 12 for r in rows.values())
    allowances = {
        w: snapshot_allowance_ppm(r.remaining, r.share_ppm, r.active_reporters, 50)
        for w, r in rows.items()
    }
    assert sum(r.share_ppm for r in rows.values()) <= PPM
    assert sum(allowances.values()) <= max(r.remaining for r in rows.values()) * PPM
    assert allowances["w0"] >= 4 * (50 * PPM // 12)
    assert allowances["w0"] == max(allowances.values())


def test_a_quiet_full_key_keeps_its_even_split_and_owes_no_refresh() -> None:
    """Demand well below a quarter of a full bucket: shares stay even, and a report that
    changes nothing but demand owes the other reporters no refresh."""
    o, key = _owner(burst=100_000)
    for i in range(4):
        _report(o, NOW, key, f"w{i}", 1, 1, 0)
    o.tick(NOW + 5 * MS)  # the tick looks at the key once every reporter is counted
    changes = o.keys[key].changes
    [(_, row)] = _rows(_report(o, NOW + 6 * MS, key, "w0", 2, 2, 0), "w0")
    basis = share_basis(row.remaining, 100_000, FLOOR, 4, 6)
    assert shares_even(basis) and row.share_ppm == basis.even_ppm
    assert o.keys[key].changes == changes


# -- the worker: a spent bootstrap allowance reports at once --------------------------------


def _worker(n_members: int = 12, b: int = 50) -> tuple[Reporter, Admission, list[int]]:
    p = policy("t", rate=1000, burst=100, b=b)
    ring = Ring(["w"] + [f"o{i}" for i in range(n_members - 1)], 1)
    r = Reporter("w", 7, ring)
    woken: list[int] = []
    r.wake = lambda: woken.append(1)
    return r, Admission(cache(p), 0, reporter=r), woken


def _sent(effects: list[Effect]) -> list[UsageReport]:
    return [
        u
        for e in effects
        if isinstance(e, Send) and isinstance(e.message, ReportBatch)
        for u in e.message.reports
    ]


def test_a_spent_bootstrap_allowance_reports_at_once() -> None:
    r, a, woken = _worker()
    allowance = r.bootstrap_allowance(policy("t", b=50))
    assert allowance == 5  # ceil(50 / 12)
    for i in range(allowance):
        assert a.try_admit("t", "read_iops").allowed
        assert len(woken) == (1 if i == allowance - 1 else 0)  # only once it is spent
    assert not a.try_admit("t", "read_iops").allowed
    assert len(woken) == 1
    [u] = _sent(r.flush(1 * MS))
    assert (u.sequence, u.iops_delta, u.denied_delta) == (1, allowance, 1)


def test_a_bootstrap_view_used_lightly_waits_for_the_tick() -> None:
    r, a, woken = _worker()
    assert a.try_admit("t", "read_iops").allowed
    assert woken == []  # one unit of five: the tick's flush carries it
    [u] = _sent(r.flush(5 * MS))
    assert u.iops_delta == 1
    # Its next use, still in bootstrap but with a report in flight, waits for the
    # threshold or the tick as before: only the first report hurries.
    for _ in range(4):
        a.try_admit("t", "read_iops")
    assert woken == []
    v = a.gate("t", "read_iops")
    assert isinstance(v, GlobalGate) and v.state is SnapshotState.BOOT


# -- reports past a gap (SnapshotBatch.applied_above) ----------------------------------------


def test_a_report_past_a_gap_is_subtracted_once() -> None:
    """Under jitter a worker's second report overtakes its first. The owner applies it and
    acknowledges only up to the gap, but its row says the second is applied: the worker
    keeps both reports (the first goes again) and subtracts only the first's usage from
    the allowance, since `remaining` already reflects the second's. Once the first
    arrives, the acknowledgement passes both and nothing is left to subtract."""
    ring = Ring(["o", "w"], 1)
    [pol] = owned_policies(ring, "o", 1, rate=1000, burst=100, b=50)
    policies = cache(pol)
    o, w = Member("o", 1, ring, policies, 0), Member("w", 1, ring, policies, 0)
    key = pol.rate_key

    def admit(n: int) -> int:
        return sum(w.admission.try_admit(key.tenant_id, "read_iops").allowed for _ in range(n))

    def reports(effects: list[Effect]) -> list[ReportBatch]:
        return [
            e.message for e in effects if isinstance(e, Send) and isinstance(e.message, ReportBatch)
        ]

    assert admit(3) == 3
    [lost] = reports(w.flush(NOW))  # sequence 1: lost on the way
    assert admit(4) == 4
    [second] = reports(w.flush(NOW + 5 * MS))
    assert second.sequences == (2,)
    replies = [e.message for e in o.deliver(NOW + 6 * MS, second) if isinstance(e, Send)]
    [batch] = [m for m in replies if isinstance(m, SnapshotBatch)]
    assert batch.acks == (0,) and batch.applied_above == (1,)  # bit 0: sequence 0 + 2
    assert batch.remaining == (100 - 4,)
    w.deliver(NOW + 7 * MS, batch)
    v = w.reporter.gates[key]
    assert v.state is SnapshotState.FRESH
    assert v.unacked == 7 and v.applied_above == 4
    assert v.avail == v.allowance - 3
    # The first report arrives (a resend, or late): the acknowledgement passes both.
    replies = [e.message for e in o.deliver(NOW + 8 * MS, lost) if isinstance(e, Send)]
    [batch] = [m for m in replies if isinstance(m, SnapshotBatch)]
    assert batch.acks == (2,) and batch.applied_above == ()
    w.deliver(NOW + 9 * MS, batch)
    assert v.unacked == 0 and v.applied_above == 0 and v.avail == v.allowance

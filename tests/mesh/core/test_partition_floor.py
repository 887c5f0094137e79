"""Serving through partitions (docs/partitions.md): a worker cut off from a key's
owner spends only its floor, for a bounded span, and says so; the owner escrows that floor
for a silent member, nets the usage reported when it returns, and escrows nothing for a
member that left the ring. The floor follows the member's recent usage (never above what
the owner escrows), and a member refused as much as it admits has none. Real members over
the in-memory network, a fake clock."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.core.config import MS, PARTITION_FLOOR_MS, CoreConfig
from mesh.core.gcra import NS_PER_S
from mesh.core.policy import BOUNDS, RateKey
from mesh.core.reporter import GlobalGate, SnapshotState
from mesh.core.shares import (
    FLOOR_HEADROOM,
    PPM,
    UsageWindow,
    floor_burst,
    floor_demand_ppm,
    floor_ppm,
    floor_start,
    floor_units,
)
from mesh.core.verdict import Suspension
from mesh.errors import ConfigError
from mesh.testing.fleet import MemoryFleet, Offered, drive
from tests.mesh._helpers import cache, policy

R, B, b = 2000, 200, 40
N = 4
CFG = CoreConfig(partition_floor_ms=PARTITION_FLOOR_MS)  # floors on (off by default)
KEY: RateKey = policy("t", rate=R, burst=B, b=b).rate_key


def fleet(seed: int = 1) -> MemoryFleet:
    f = MemoryFleet(
        [f"w{i}" for i in range(N)],
        cache(policy("t", rate=R, burst=B, b=b)),
        seed=seed,
        config=CFG,
    )
    f.run_until(NS_PER_S // 5)  # owners past their conservative start
    return f


def cut_off(f: MemoryFleet, victim: str) -> None:
    for m in f.members:
        if m != victim:
            f.cut.add(frozenset((victim, m)))


def warm(f: MemoryFleet, offered: int = R // 2) -> tuple[str, str]:
    """Everyone reports the key for a while (under its limit unless `offered` says
    otherwise); returns (its owner, a worker cut off next)."""
    owner = f.ring.owner_of(KEY)
    victim = next(m for m in sorted(f.ring.members) if m != owner)
    drive(f, [Offered("t", offered)], f.now_ns + 500 * MS)
    return owner, victim


def test_a_cut_off_worker_spends_its_floor_only_for_the_bounded_span() -> None:
    f = fleet()
    _, victim = warm(f)
    cut_off(f, victim)
    cut_at = f.now_ns
    served: list[tuple[int, int]] = []  # (ms since the cut, admitted in that ms)
    for ms in range(1, (CFG.floor_wait_ns + CFG.floor_ns) // MS + 200):
        f.run_until(cut_at + ms * MS)
        got = 0
        # 1,000/s offered to the victim alone until its floor may open (a burst of refusals
        # at the cut, before the owner stopped hearing it, would count against its floor),
        # then 10,000/s: far above any floor.
        for _ in range(1 if ms * MS < CFG.floor_wait_ns else 10):
            v = f.try_admit(victim, "t", "read_iops")
            if ms > (CFG.snapshot_ttl_ms + 2 * CFG.sync_interval_ms):
                assert v.suspended is not None, (ms, v)  # stale or floored: never silent
            if v.allowed and v.suspended is not None:
                assert v.suspended is Suspension.OWNER_UNREACHABLE, (ms, v)
                assert v.bound == BOUNDS["global_floor"], (ms, v)
            got += v.allowed
        served.append((ms, got))
    gate = f.members[victim].admission.gate("t", "read_iops")
    assert isinstance(gate, GlobalGate) and gate.state is SnapshotState.STALE
    floor_ms = [ms for ms, got in served if got and ms > CFG.snapshot_ttl_ms + CFG.sync_interval_ms]
    assert floor_ms, "the cut-off worker served nothing from its floor"
    # It opens only after the owner's lease on it lapsed (the escrow covers it from then) ...
    assert min(floor_ms) * MS >= CFG.floor_wait_ns - CFG.snapshot_ttl_ns
    # ... and closes within partition_floor_ms of opening: afterwards it admits nothing.
    assert max(floor_ms) * MS <= CFG.floor_wait_ns + CFG.floor_ns
    assert all(got == 0 for ms, got in served[-150:])
    # At its floor rate only (R / N here: its usage, R / 2N, with headroom is more), from
    # what the escrow charged before it opened: at most what that rate earns from then.
    part = gate.floor_ppm  # its share in the row it held, at most R / N
    assert 0.9 * PPM // N <= part <= floor_ppm(gate.snap_floor_ppm, N), part
    span_ns = (max(floor_ms) - min(floor_ms) + 1) * MS
    limit = floor_units(R, span_ns + CFG.escrow_after_ns, part) + 1
    total = sum(got for ms, got in served if ms in floor_ms)
    assert total <= limit, (total, limit)
    assert total >= 0.8 * floor_units(R, span_ns, part), (total, limit)  # and it does serve


def test_the_owner_escrows_a_silent_members_floor_and_nets_it_on_return() -> None:
    f = fleet()
    owner, victim = warm(f)
    o = f.members[owner].owner
    cut_off(f, victim)
    cut_at = f.now_ns
    # The victim spends its floor; the others keep the key busy, so the owner looks at it.
    served = 0
    t = cut_at
    while t < cut_at + CFG.floor_wait_ns + 500 * MS:
        t += MS
        f.run_until(t)
        for m in sorted(f.members):
            # The victim is offered far above its floor once it may open (not before: a
            # burst of refusals at the cut would count against its floor).
            tries = 10 if m == victim and t - cut_at >= CFG.floor_wait_ns else 1
            verdicts = [f.try_admit(m, "t", "read_iops") for _ in range(tries)]
            if m == victim:  # from its floor (what it spends of its last allowance is N*b)
                served += sum(
                    v.allowed and v.suspended is Suspension.OWNER_UNREACHABLE for v in verdicts
                )
    ks = o.keys[KEY]
    assert ks.escrow is not None and victim in ks.escrow, ks.escrow
    e = ks.escrow[victim]
    # Charged at the floor from when the owner sent the newest batch the victim confirmed
    # (the anchor), up to its last
    # look at the key (this millisecond or the one before); nothing at once.
    owed = floor_units(R, f.local_ns(owner) - e.from_ns, e.part_ppm)
    assert owed - floor_units(R, 2 * MS, e.part_ppm) - 1 <= e.charged <= owed, (e, owed)
    g = f.members[victim].admission.gate("t", "read_iops")
    assert isinstance(g, GlobalGate) and 0 < g.floor_ppm <= e.part_ppm, (g, e)
    # The escrow covers what the victim spent: what it owes by now (it charges that at the
    # next look at the key, before anyone hears what remains) is at least that.
    assert owed >= served, (e, owed, served)
    charged = o.escrows.charged_units
    applied = o.applied_units
    f.cut.clear()
    drive(f, [Offered("t", R)], f.now_ns + 100 * MS)
    # Its reports came back: the usage spent on the floor was netted, not applied twice.
    assert o.escrows.netted_units > 0
    assert o.escrows.netted_units <= o.escrows.charged_units
    # Charging stopped once it confirmed hearing us again: its resend, our answer and its
    # next report, a round trip and two flushes after the heal.
    assert o.escrows.charged_units - charged <= floor_units(R, 20 * MS, e.part_ppm) + 1
    assert o.applied_units - applied >= o.escrows.netted_units
    v = f.members[victim].admission.gate("t", "read_iops")
    assert isinstance(v, GlobalGate) and v.state is SnapshotState.FRESH and v.floor is None


def test_no_escrow_for_a_member_that_left_the_ring() -> None:
    f = fleet()
    owner, victim = warm(f)
    o = f.members[owner].owner
    cut_off(f, victim)
    drive(f, [Offered("t", R)], f.now_ns + CFG.floor_wait_ns + 50 * MS)
    escrow = o.keys[KEY].escrow
    assert escrow is not None and victim in escrow
    f.set_ring([m for m in f.ring.members if m != victim])
    if f.ring.owner_of(KEY) != owner:
        pytest.skip("the key moved with the ring change")  # pragma: no cover
    charged = o.escrows.charged_units
    drive(f, [Offered("t", R)], f.now_ns + 300 * MS)
    assert not (o.keys[KEY].escrow or {}).get(victim)
    assert o.escrows.charged_units == charged


def test_no_floor_nor_escrow_for_a_member_refused_as_much_as_it_admits() -> None:
    # Offered four times the limit: every worker is refused more than it admits. The
    # key is saturated, the others take up what a cut-off worker does not spend, and an
    # escrow would only hold back capacity whenever one of them pauses.
    f = fleet(seed=2)
    owner, victim = warm(f, offered=4 * R)
    cut_off(f, victim)
    drive(f, [Offered("t", R)], f.now_ns + CFG.floor_wait_ns + 300 * MS)
    v = f.try_admit(victim, "t", "read_iops")
    assert not v.allowed and v.suspended is Suspension.OWNER_UNREACHABLE, v
    assert not (f.members[owner].owner.keys[KEY].escrow or {}).get(victim)
    assert f.members[owner].owner.escrows.charged_units == 0


@pytest.mark.parametrize("seed", range(8))
def test_the_floor_follows_recent_usage_and_never_exceeds_the_escrow(seed: int) -> None:
    """A victim that used a random, small rate of the key gets a floor of about
    FLOOR_HEADROOM times it (never more than the owner escrows for it), and a worker that
    merely paused costs the others no more than that."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    f = fleet(seed=seed)
    owner = f.ring.owner_of(KEY)
    victim = rng.choice([m for m in sorted(f.ring.members) if m != owner])
    rate = rng.randint(20, 200)  # per second, the victim's alone: far below R / N
    t_end = f.now_ns + 600 * MS
    carry = 0.0
    while f.now_ns < t_end:
        f.run_until(f.now_ns + MS)
        carry += rate / 1000
        while carry >= 1:
            carry -= 1
            f.try_admit(victim, "t", "read_iops")
    cut_off(f, victim)
    o = f.members[owner].owner
    other = next(m for m in sorted(f.ring.members) if m not in (owner, victim))
    t_end = f.now_ns + CFG.floor_wait_ns + 80 * MS
    while f.now_ns < t_end:  # the victim is offered work: its view goes stale, its floor
        f.run_until(f.now_ns + 10 * MS)  # opens; another worker's reports have the owner
        f.try_admit(victim, "t", "read_iops")  # look at the key (escrows open lazily)
        f.try_admit(other, "t", "read_iops")
    e = (o.keys[KEY].escrow or {}).get(victim)
    v = f.members[victim].admission.gate("t", "read_iops")
    assert isinstance(v, GlobalGate), (seed, v)
    assert e is not None, (seed, rate, o.keys[KEY].escrow)
    # The owner escrows about FLOOR_HEADROOM times the rate (over its window, rounded to
    # whole grains), far below the even share it escrowed before floors followed usage.
    assert e.part_ppm <= floor_ppm(PPM // N, N), (seed, e)
    assert e.part_ppm <= 2 * FLOOR_HEADROOM * rate * PPM // R + 1, (seed, rate, e)
    assert v.floor is not None, (seed, rate, v.state)
    assert 0 < v.floor_ppm <= e.part_ppm, (seed, v.floor_ppm, e)


def test_the_floor_is_on_by_default_and_its_span_is_below_failure_detection() -> None:
    """The default span is shorter than the node's default membership failure detection
    (the etcd lease, 5 s), so a floor ends before the ring can drop its member."""
    assert CoreConfig().partition_floor_ms == PARTITION_FLOOR_MS
    assert 0 < PARTITION_FLOOR_MS < 5_000


def test_no_floor_when_turned_off() -> None:
    cfg = CoreConfig(partition_floor_ms=0)
    f = MemoryFleet(
        [f"w{i}" for i in range(N)],
        cache(policy("t", rate=R, burst=B, b=b)),
        seed=3,
        config=cfg,
    )
    f.run_until(NS_PER_S // 5)
    owner, victim = warm(f)
    cut_off(f, victim)
    f.run_until(f.now_ns + cfg.floor_wait_ns + 100 * MS)
    v = f.try_admit(victim, "t", "read_iops")
    assert not v.allowed and v.suspended is Suspension.OWNER_UNREACHABLE, v
    assert f.members[owner].owner.escrows.charged_units == 0


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"partition_floor_ms": -1}, "core.partition_floor_ms"),
        ({"partition_floor_ms": "2s"}, "core.partition_floor_ms"),
        ({"partition_floor_ms": True}, "core.partition_floor_ms"),
    ],
)
def test_a_bad_partition_floor_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        CoreConfig.from_dict(data)
    assert err.value.field == field, err.value


def test_the_floor_formulas() -> None:
    assert floor_ppm(PPM, 8) == PPM // 8  # capped at the ring's even share
    assert floor_ppm(1000, 8) == 1000  # a small share is its own floor
    assert floor_units(1000, NS_PER_S, PPM // 8) == 125
    assert floor_units(1000, -5, PPM) == 0
    lease = CFG.reporter_lease_ms * MS
    assert floor_burst(1000, PPM // 8, lease, 32) == 6  # 125/s over 50 ms
    assert floor_burst(1000, 10, lease, 32) == 1  # never below one unit
    assert floor_burst(10**6, PPM, lease, 32) == 32  # never above b
    assert floor_ppm(PPM, 8, 1000) == 1000  # a small demand part is the floor
    assert floor_demand_ppm(1000, 10, 0, 400 * MS) == FLOOR_HEADROOM * 25_000  # 25/s of 1000/s
    assert floor_demand_ppm(1000, 10, 10, 400 * MS) == 0  # refused as much as admitted
    assert floor_demand_ppm(1000, 0, 0, 400 * MS) == 0
    assert floor_demand_ppm(1, 10**9, 0, MS) == PPM
    assert floor_start(1000, PPM // 8, 30 * MS, 6) == 3  # what 125/s earns in 30 ms
    assert floor_start(1000, PPM, 30 * MS, 6) == 6  # never above the burst


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    rate=st.integers(1, 10**9),
    used=st.integers(0, 10**6),
    fewer=st.integers(0, 10**6),
    denied=st.integers(0, 10**6),
    more=st.integers(0, 10**6),
    window_ms=st.integers(1, 10_000),
)
def test_the_demand_part_is_monotone(
    rate: int, used: int, fewer: int, denied: int, more: int, window_ms: int
) -> None:
    """The worker counts no more usage and no fewer denials than the owner: its part is
    never larger (docs/partitions.md, step 2)."""
    owner = floor_demand_ppm(rate, used, denied, window_ms * MS)
    worker = floor_demand_ppm(rate, max(0, used - fewer), denied + more, window_ms * MS)
    assert 0 <= worker <= owner <= PPM


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    notes=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 50)), max_size=40),
    first=st.integers(-5, 45),
)
def test_a_usage_window_counts_what_it_kept(notes: list[tuple[int, int]], first: int) -> None:
    """`since` is exactly the units noted in grains `first` on while `covers` says none of
    them was dropped; never more than noted."""
    w = UsageWindow(5)
    kept: dict[int, int] = {}
    for grain, units in notes:
        w.note(grain, units)
        if grain > w.newest - 5:
            kept[grain] = kept.get(grain, 0) + units
    newest = w.newest
    noted = sum(u for g, u in kept.items() if g >= first and g > newest - 5)
    assert w.since(first) == noted
    if w.covers(first):
        assert w.since(first) == sum(u for g, u in notes if g >= first)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 30 * MS),  # time since the previous step
            st.integers(0, 40),  # units applied from the reporter
            st.integers(0, 40),  # units refused it
            st.integers(0, PPM),  # the share its row is sent with
        ),
        min_size=1,
        max_size=60,
    ),
    members=st.integers(1, 8),
)
def test_the_promised_floor_is_the_formula_over_the_window_at_every_row(
    steps: list[tuple[int, int, int, int]], members: int
) -> None:
    """`Escrows.promise` sums the window's complete grains once a grain and adds the
    current grain per row: the part it promises is exactly `floor_ppm` of the demand over
    the whole window as of the row (computed once a grain, it once lagged the grain's
    later usage, and half-partition's quiet tenant fell below 0.99 of its ideal)."""
    from mesh.core.gcra import Gcra
    from mesh.core.owner._escrow import Escrows
    from mesh.core.owner._state import KeyState, ReporterState

    cfg = CoreConfig()
    esc = Escrows(cfg, members, "owner")
    p = policy()
    ks = KeyState(p, Gcra(p.target_rate, p.global_burst, 0), 1, 0)
    rs = ReporterState(1, 1, 0)
    now = 10 * NS_PER_S
    for dt, used, refused, share in steps:
        now += dt
        esc.note_used(rs, used, refused, esc.grain(now))
        first = (now - cfg.floor_window_ns) // cfg.floor_grain_ns
        units = 0 if rs.floor_used is None else rs.floor_used.since(first)
        denied = 0 if rs.floor_denied is None else rs.floor_denied.since(first)
        want = floor_ppm(
            share,
            members,
            floor_demand_ppm(p.target_rate, units, denied, cfg.floor_window_ns),
        )
        assert esc.promise(ks, rs, "w", share, now) == want


def test_an_escrow_for_a_member_that_paused_is_given_back_when_it_closes() -> None:
    """A member that stops reporting has its floor escrowed (its owner cannot tell a pause
    from a cut) until its idle mark; what its reports did not net is given back to the key
    when the escrow closes, so pauses cost the other members nothing in the end."""
    f = MemoryFleet(["a", "b", "c"], cache(policy("t", rate=1000, burst=100, b=20)), seed=1)
    f.run_until(NS_PER_S)
    key = policy("t", rate=1000, burst=100, b=20).rate_key
    owner = f.ring.owner_of(key)
    quiet, busy = [m for m in sorted(f.members) if m != owner]
    for i in range(900):  # R/4 through each of two members; one goes quiet after 300 ms
        f.run_until(f.now_ns + MS)
        if i % 4 == 0:
            f.try_admit(busy, "t", "read_iops")
            if i < 300:
                f.try_admit(quiet, "t", "read_iops")
    f.run_until(f.now_ns + 300 * MS)
    e = f.members[owner].owner.escrows
    assert e.charged_units > 0, "the pause was escrowed"
    assert e.refunded_units > 0
    assert e.charged_units == e.netted_units + e.refunded_units


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    notes=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 50)), max_size=40),
    first=st.integers(-5, 45),
    span=st.integers(0, 8),
)
def test_a_usage_window_sums_a_range_as_grain_by_grain(
    notes: list[tuple[int, int]], first: int, span: int
) -> None:
    """`before` takes a shortcut for n - 1 or n kept grains (the owner's once-a-grain sum);
    it is exactly the grain-by-grain sum of what is kept in the range."""
    w = UsageWindow(5)
    for grain, units in notes:
        w.note(grain, units)
    end = first + span
    lo, hi = max(first, w.newest - 4), min(end, w.newest + 1)
    assert w.before(first, end) == sum(w.counts[g % 5] for g in range(lo, hi))

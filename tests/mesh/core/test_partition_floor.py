"""Serving through partitions (issue 12, docs/partitions.md): a worker cut off from a key's
owner spends only its floor, for a bounded span, and says so; the owner escrows that floor
for a silent member, nets the usage reported when it returns, and escrows nothing for a
member that left the ring. Real members over the in-memory network, a fake clock."""

from __future__ import annotations

import pytest

from mesh.core.config import MS, CoreConfig
from mesh.core.gcra import NS_PER_S
from mesh.core.policy import BOUNDS, RateKey
from mesh.core.reporter import GlobalGate, SnapshotState
from mesh.core.shares import PPM, floor_burst, floor_ppm, floor_units
from mesh.core.verdict import Suspension
from mesh.errors import ConfigError
from mesh.testing.fleet import MemoryFleet, Offered, drive
from tests.mesh._helpers import cache, policy

R, B, b = 2000, 200, 40
N = 4
CFG = CoreConfig(partition_floor_ms=2000)
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


def warm(f: MemoryFleet) -> tuple[str, str]:
    """Everyone reports the key for a while; returns (its owner, a worker cut off next)."""
    owner = f.ring.owner_of(KEY)
    victim = next(m for m in sorted(f.ring.members) if m != owner)
    drive(f, [Offered("t", 2 * R)], f.now_ns + 200 * MS)
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
        for _ in range(10):  # 10,000/s offered to the victim alone: far above any floor
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
    # At its floor rate only: at most R / N over the span plus the floor's burst.
    part = floor_ppm(PPM // N, N)
    span_ns = (max(floor_ms) - min(floor_ms) + 1) * MS
    limit = floor_units(R, span_ns, part) + floor_burst(R, part, CFG.reporter_lease_ms * MS, b)
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
            tries = 10 if m == victim else 1
            got = sum(f.try_admit(m, "t", "read_iops").allowed for _ in range(tries))
            served += got if m == victim else 0
    ks = o.keys[KEY]
    assert ks.escrow is not None and victim in ks.escrow, ks.escrow
    e = ks.escrow[victim]
    # Charged at the floor from when the owner last heard from the victim, up to its last
    # look at the key (this millisecond or the one before), and the part of the floor's
    # burst that rate had not covered when the floor could open, at once.
    owed = e.extra + floor_units(R, f.local_ns(owner) - e.from_ns, e.part_ppm)
    assert owed - floor_units(R, 2 * MS, e.part_ppm) - 1 <= e.charged <= owed, (e, owed)
    assert e.charged >= served, (e, served)  # the escrow covers what the victim spent
    charged = o.escrows.charged_units
    applied = o.applied_units
    f.cut.clear()
    drive(f, [Offered("t", R)], f.now_ns + 100 * MS)
    # Its reports came back: the usage spent on the floor was netted, not applied twice.
    assert o.escrows.netted_units > 0
    assert o.escrows.netted_units <= o.escrows.charged_units
    # Charging stopped when it was heard again (a trip and a flush after the heal).
    assert o.escrows.charged_units - charged <= floor_units(R, 10 * MS, e.part_ppm) + 1
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

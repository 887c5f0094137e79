"""Graceful leave hands keys over: the new owner continues from the leaver's state.

Owners here run on different clocks (as processes do): the leaver's `now` is near 100 s, the
receiver's near 5000 s, so only clock-free state can cross between them.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.core._validate import INT_MAX
from mesh.core.config import MS
from mesh.core.effects import Send
from mesh.core.gcra import NS_PER_S
from mesh.core.messages import (
    HANDOVER_WATERMARKS_MAX,
    SCHEMA_VERSION,
    Handover,
    KeyHandover,
    ReportBatch,
    ReporterWatermark,
    SnapshotBatch,
    UsageReport,
    decode,
    encode,
    from_wire,
    to_wire,
)
from mesh.core.owner import Owner
from mesh.core.owner._handover import DEPARTED_GRACE_NS, PENDING_TTL_NS, ahead_max_ns
from mesh.core.owner._plausible import ORDER_MAX, claim_tolerance
from mesh.core.policy import Metric, RateKey, TenantRatePolicy
from mesh.core.ring import Ring
from mesh.errors import MessageError, MessageTypeError
from mesh.testing.fleet import MemoryFleet, Offered, drive
from tests.mesh._helpers import cache, policy

SLOW = policy("*", rate=10, burst=100, b=20)  # 10 s from empty to full: drains are tiny
WORKERS = ("w", "x")  # they report; members, as every reporter is
RING3 = Ring(["a", "b", "c", *WORKERS], 1)
RING2 = RING3.with_members(["a", "b", *WORKERS])  # c has left
C_NOW = 100 * NS_PER_S  # the leaver's clock
A_NOW = 5_000 * NS_PER_S  # the receiver's clock


def moving(to: str, n: int = 1) -> list[RateKey]:
    """Keys c owns now that `to` owns once c has left."""
    out = []
    for i in range(10_000):
        k = RateKey(f"t{i}", Metric.READ_IOPS, 1)
        if RING3.owner_of(k) == "c" and RING2.owner_of(k) == to:
            out.append(k)
            if len(out) == n:
                return out
    raise AssertionError("no such keys")


K, K2 = moving("a", 2)
KB = moving("b")[0]  # handed to b, never a's to hold


def report(
    key: RateKey,
    worker: str,
    seq: int,
    delta: int,
    *,
    epoch: int = 1,
    ring_epoch: int = 1,
    unacked_from: int | None = None,
) -> ReportBatch:
    return ReportBatch.of(
        worker,
        ring_epoch,
        [
            UsageReport(
                key,
                worker,
                epoch,
                seq,
                iops_delta=delta,
                unacked_from=seq if unacked_from is None else unacked_from,
            )
        ],
    )


def remaining(effects: list[Any], key: RateKey) -> int:
    snaps = [
        s
        for e in effects
        if isinstance(e, Send) and isinstance(e.message, SnapshotBatch)
        for s in e.message.snapshots
        if s.rate_key == key
    ]
    assert snaps, effects
    return snaps[-1].remaining


def leaver(p: TenantRatePolicy = SLOW) -> Owner:
    return Owner("c", RING3, cache(p), 0)


def receiver(p: TenantRatePolicy = SLOW, ring: Ring = RING3) -> Owner:
    return Owner("a", ring, cache(p), 0)


def handover_to(c: Owner, to: str, now_ns: int = C_NOW) -> Handover:
    msgs = [
        e.message
        for e in c.hand_over(now_ns, RING2)
        if isinstance(e, Send) and isinstance(e.message, Handover) and e.to == to
    ]
    assert len(msgs) == 1
    return msgs[0]


def first_use(a: Owner, key: RateKey, now_ns: int, worker: str = "x") -> int:
    """A worker's first report to the new owner opens the key; what remains after it."""
    return remaining(a.receive(now_ns, report(key, worker, 1, 1, ring_epoch=RING2.epoch)), key)


# -- the hand-over keeps the key's state ----------------------------------------------------


def test_a_nearly_exhausted_key_stays_nearly_exhausted_and_a_full_one_stays_full() -> None:
    c = leaver()
    c.receive(C_NOW - 5 * NS_PER_S, report(K2, "w", 1, 1))  # long refilled: full again
    assert remaining(c.receive(C_NOW, report(K, "w", 1, 90)), K) == 10
    msg = handover_to(c, "a")
    assert {k.rate_key: k.ahead_ns for k in msg.keys} == {K: 9 * NS_PER_S, K2: 0}
    a = receiver()
    a.take_handover(A_NOW, decode(encode(msg)))  # type: ignore[arg-type]
    a.ring_changed(A_NOW, RING2)
    assert first_use(a, K, A_NOW + MS) == 9  # 10 left, one more used
    assert first_use(a, K2, A_NOW + MS) == 99  # full, one used
    assert a.handovers.stats()["resumed"] == 2
    # Without the hand-over, the same keys restart exhausted (seed 004's conservative start).
    cold = receiver()
    cold.ring_changed(A_NOW, RING2)
    assert first_use(cold, K, A_NOW + MS) == 0 and first_use(cold, K2, A_NOW + MS) == 0


def test_the_leaver_stops_applying_what_it_handed_over() -> None:
    c = leaver()
    c.receive(C_NOW, report(K, "w", 1, 10))
    c.hand_over(C_NOW, RING2)
    c.ring_changed(C_NOW, RING2)  # what Member.leave does next
    effects = c.receive(C_NOW + MS, report(K, "w", 2, 5))
    [rej] = [
        j
        for e in effects
        if isinstance(e, Send) and isinstance(e.message, SnapshotBatch)
        for j in e.message.rejections
    ]
    assert rej.reason.value == "not_owner" and c.applied_units == 10
    assert K not in c.keys and K not in c.applied  # moved away: its telemetry went with it


def test_handed_watermarks_make_resends_duplicates() -> None:
    c = leaver()
    for seq in (1, 2, 3):
        c.receive(C_NOW, report(K, "w", seq, 10, unacked_from=1))
    a = receiver()
    a.take_handover(A_NOW, handover_to(c, "a"))
    a.ring_changed(A_NOW, RING2)
    # The ack of 3 was lost: w resends it to the new owner, which already has it.
    effects = a.receive(A_NOW + MS, report(K, "w", 3, 10, ring_epoch=RING2.epoch, unacked_from=3))
    assert remaining(effects, K) == 70 and a.duplicates == 1
    assert (
        remaining(
            a.receive(A_NOW + MS, report(K, "w", 4, 10, ring_epoch=RING2.epoch, unacked_from=3)), K
        )
        == 60
    )


def test_the_handed_debt_drains_while_it_waits_for_the_key_to_open() -> None:
    c = leaver()
    c.receive(C_NOW, report(K, "w", 1, 90))
    a = receiver()
    a.take_handover(A_NOW, handover_to(c, "a"))
    a.ring_changed(A_NOW, RING2)
    assert first_use(a, K, A_NOW + 3 * NS_PER_S) == 39  # 10 left + 30 refilled - 1


def test_member_leave_hands_over_then_routes_without_itself() -> None:
    from mesh.core.member import Member

    c = Member("c", 7, RING3, cache(SLOW), 0)
    c.deliver(C_NOW, report(K, "a", 1, 50))  # from a member: a stranger's is refused
    effects = c.leave(C_NOW)
    assert [(e.to, type(e.message)) for e in effects if isinstance(e, Send)] == [("a", Handover)]
    assert "c" not in c.ring and c.ring.epoch == RING3.epoch and not c.owner.keys


# -- what a receiver refuses -----------------------------------------------------------------


def test_a_handover_from_a_stranger_or_itself_changes_nothing() -> None:
    c = leaver()
    c.receive(C_NOW, report(K, "w", 1, 10))
    msg = handover_to(c, "a")
    a = receiver()
    for sender in ("z", "a"):
        a.take_handover(A_NOW, Handover(sender, msg.ring_epoch, msg.keys))
    assert a.handovers.stats()["ignored_sender"] == 2 and not a.handovers.pending
    a.ring_changed(A_NOW, RING2)
    assert first_use(a, K, A_NOW + MS) == 0  # the conservative start, as without it


def test_keys_the_receiver_does_not_own_without_the_sender_are_ignored() -> None:
    c = leaver()
    c.receive(C_NOW, report(KB, "w", 1, 10))
    [item] = handover_to(c, "b").keys
    a = receiver()
    a.take_handover(A_NOW, Handover("c", 1, (item,)))
    assert a.handovers.stats()["ignored_not_owner"] == 1 and not a.handovers.pending
    # A key a owns in the ring with c too is not c's to hand over (nor to loosen).
    mine = next(
        RateKey(f"t{i}", Metric.READ_IOPS, 1)
        for i in range(1000)
        if RING3.owner_of(RateKey(f"t{i}", Metric.READ_IOPS, 1)) == "a"
    )
    a.take_handover(A_NOW, Handover("c", 1, (KeyHandover(mine, 0, 1, 1),)))
    assert a.handovers.stats()["ignored_not_owner"] == 2


def test_a_member_that_left_long_ago_cannot_hand_over() -> None:
    c = leaver()
    c.receive(C_NOW, report(K, "w", 1, 10))
    msg = handover_to(c, "a")
    a = receiver()
    a.ring_changed(A_NOW, RING2)  # c left a's ring first: a hand-over may still follow
    a.take_handover(A_NOW + DEPARTED_GRACE_NS, msg)
    assert K in a.handovers.pending
    late = receiver()
    late.ring_changed(A_NOW, RING2)
    late.take_handover(A_NOW + DEPARTED_GRACE_NS + 1, msg)
    assert late.handovers.stats()["ignored_sender"] == 1 and not late.handovers.pending


def test_a_parked_key_expires_or_moves_on() -> None:
    c = leaver()
    c.receive(C_NOW, report(K, "w", 1, 10))
    msg = handover_to(c, "a")
    a = receiver()
    a.take_handover(A_NOW, msg)
    a.ring_changed(A_NOW + PENDING_TTL_NS, RING2)
    assert first_use(a, K, A_NOW + PENDING_TTL_NS + 1) == 0  # too old: conservative start
    b = receiver()
    b.take_handover(A_NOW, msg)
    b.ring_changed(A_NOW, RING3.with_members(["b", "c", *WORKERS]))  # no longer a's to hold
    assert not b.handovers.pending


# -- duplicates and late hand-overs never loosen a key --------------------------------------


def test_a_key_open_before_its_handover_keeps_the_stricter_state() -> None:
    c = leaver()
    c.receive(C_NOW - 20 * NS_PER_S, report(K, "w", 1, 1))  # full by now
    msg = handover_to(c, "a")
    a = receiver()
    a.ring_changed(A_NOW, RING2)
    assert first_use(a, K, A_NOW) == 0  # opened conservatively before the hand-over came
    a.take_handover(A_NOW + MS, msg)
    assert a.keys[K].meter.remaining(A_NOW + MS) == 0 and a.handovers.tightened == 0


def test_an_open_key_takes_the_handed_debt_plus_what_it_applied_since() -> None:
    fast = policy("*", rate=1000, burst=100, b=20)  # refills in 0.1 s
    c = leaver(fast)
    c.receive(C_NOW, report(K, "w", 1, 50))
    msg = handover_to(c, "a")
    a = receiver(fast)
    a.ring_changed(A_NOW, RING2)
    t = A_NOW + 200 * MS  # a held its position for a full refill: the key opens full
    a.receive(t, report(K, "x", 1, 30, ring_epoch=RING2.epoch))
    assert a.keys[K].meter.remaining(t) == 70
    a.take_handover(t, msg)  # c's 50 and a's 30 (which c never saw)
    assert a.keys[K].meter.remaining(t) == 20 and a.handovers.tightened == 1


def test_duplicate_and_stale_handovers_do_not_loosen_a_parked_key() -> None:
    c = leaver()
    c.receive(C_NOW, report(K, "w", 1, 20))
    stale = handover_to(c, "a")  # 20 used
    c.receive(C_NOW, report(K, "w", 2, 60))
    fresh = handover_to(c, "a")  # 80 used
    a = receiver()
    for m in (fresh, stale, fresh):
        a.take_handover(A_NOW, m)
    a.ring_changed(A_NOW, RING2)
    assert first_use(a, K, A_NOW) == 19  # 80 used + 1; the stale 20 changed nothing
    # Watermarks of two hand-overs: the lower is kept, so seq 2 would count again (safe).
    assert a.keys[K].reporters["w"].watermark == 1


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2_000), st.booleans(), st.integers(0, 20_000)),
        min_size=1,
        max_size=12,
    )
)
def test_every_accepted_handover_bounds_the_key_from_below(
    steps: list[tuple[int, bool, int]],
) -> None:
    """Whatever the order of hand-overs (any debt, duplicated, late) and first reports, the
    key's TAT never falls below any accepted hand-over's: received + ahead (believed up to
    `ahead_max_ns`), at rate R."""
    a = receiver()
    cap = (claim_tolerance(SLOW, a.config) + 2 * SLOW.local_burst_cap * NS_PER_S) // 10
    a.ring_changed(A_NOW, RING2)
    now, floor, seq = A_NOW, 0, 0
    for dt_ms, is_handover, ahead_ms in steps:
        now += dt_ms * MS
        if is_handover:
            ignored = a.handovers.stats()["ignored_sender"]
            a.take_handover(now, Handover("c", 1, (KeyHandover(K, ahead_ms * MS, 1, 1),)))
            if a.handovers.stats()["ignored_sender"] == ignored:  # c left within the grace
                floor = max(floor, now + min(ahead_ms * MS, cap))
        else:
            seq += 1
            a.receive(now, report(K, "x", seq, 1, ring_epoch=RING2.epoch, unacked_from=1))
        ks = a.keys.get(K)
        if ks is not None:
            assert ks.meter.tat_scaled >= floor * SLOW.target_rate


# -- the in-memory fleet --------------------------------------------------------------------


def drained_fleet(handover: bool) -> tuple[MemoryFleet, str, RateKey]:
    """Three members; a key owned by c is nearly drained, then c leaves gracefully."""
    f = MemoryFleet(["a", "b", "c"], cache(SLOW), seed=4)
    f.run_until(11 * NS_PER_S)  # owners past their conservative start
    key = moving("a")[0]
    tenant = key.tenant_id
    for _ in range(30):  # the workers spend about 80 of the burst of 100
        for m in ("a", "b", "c"):
            f.try_admit(m, tenant, "read_iops")
        f.run_until(f.now_ns + 10 * MS)
    f.run_until(f.now_ns + 50 * MS)
    used = f.members["c"].owner.applied[key]
    assert 60 <= used <= 100, used
    f.leave("c", handover=handover)
    f.run_until(f.now_ns + 50 * MS)
    for m in ("a", "b"):
        f.try_admit(m, tenant, "read_iops")
    f.run_until(f.now_ns + 50 * MS)
    return f, tenant, key


def test_fleet_leave_hands_the_key_to_its_new_owner() -> None:
    f, _, key = drained_fleet(handover=True)
    now = f.local_ns("a")
    left = f.members["a"].owner.keys[key].meter.remaining(now)
    assert 0 < left < 40, left  # continues from ~100 - used, not from exhausted
    cold, _, _ = drained_fleet(handover=False)
    assert cold.members["a"].owner.keys[key].meter.remaining(cold.local_ns("a")) <= 3


@pytest.mark.parametrize("seed", range(5))
def test_fleet_bound_holds_across_a_graceful_leave(seed: int) -> None:
    R, B, b = 2000, 200, 40
    f = MemoryFleet(["a", "b", "c", "d"], cache(policy("*", rate=R, burst=B, b=b)), seed=seed)
    f.run_until(NS_PER_S // 5)
    demand = [Offered(f"t{i}", 2 * R) for i in range(8)]
    drive(f, demand, f.now_ns + 200 * MS)
    f.leave("c")
    drive(f, demand, f.now_ns + 300 * MS)
    bound = 4 * b + R * f.propagation_delay_ns() / NS_PER_S
    for d in demand:
        assert d.max_excess <= bound, (seed, d.report())
    sent = sum(
        m.owner.handovers.stats()["resumed"] + m.owner.handovers.tightened
        for m in f.members.values()
    )
    assert sent > 0


# -- the wire --------------------------------------------------------------------------------


def sample() -> Handover:
    return Handover(
        "c",
        7,
        (
            KeyHandover(
                K,
                9 * NS_PER_S,
                7,
                41,
                (ReporterWatermark("w1", 3, 12), ReporterWatermark("w2", 1, 1)),
            ),
            KeyHandover(RateKey("acme", Metric.CLIENT_EGRESS_BYTES, 2), 0, 6, 0),
        ),
    )


def test_round_trip() -> None:
    for msg in (sample(), Handover("c", 0, ())):
        assert decode(encode(msg)) == msg
        assert to_wire(msg)[:2] == [SCHEMA_VERSION, "handover"]


def wire_with(path: tuple[int, ...], value: Any) -> list[Any]:
    obj: Any = to_wire(sample())
    target = obj
    for i in path[:-1]:
        target = target[i]
    target[path[-1]] = value
    return obj  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ((0,), 1, "schema"),
        ((2,), "", "sender"),
        ((3,), -1, "ring_epoch"),
        ((4,), "x", "keys"),
        ((4, 0), [1, 2], "keys[0]"),
        ((4, 0, 0), ["acme", "no pe", 1], "keys[0].rate_key.metric"),
        ((4, 0, 1), -5, "keys[0].ahead_ns"),
        ((4, 1, 1), 1.5, "keys[1].ahead_ns"),
        ((4, 0, 2), True, "keys[0].owner_epoch"),
        ((4, 0, 3), None, "keys[0].version"),
        ((4, 0, 4), 3, "keys[0].watermarks"),
        ((4, 0, 4, 1), ["w2", 1], "keys[0].watermarks[1]"),
        ((4, 0, 4, 1, 0), "", "keys[0].watermarks[1].worker_id"),
        ((4, 0, 4, 1, 1), -1, "keys[0].watermarks[1].worker_epoch"),
        ((4, 0, 4, 1, 2), "1", "keys[0].watermarks[1].watermark"),
        ((4, 0, 4, 1, 0), "w1", "keys[0].watermarks[1].worker_id"),  # repeated
        ((4, 1, 0), [K.tenant_id, K.metric, 1], "keys[1].rate_key"),  # repeated key
    ],
)
def test_bad_handover_names_the_field(path: tuple[int, ...], value: Any, field: str) -> None:
    with pytest.raises(MessageError) as info:
        decode(msgpack.packb(wire_with(path, value), use_bin_type=True))
    assert info.value.field == field, info.value


def test_size_limits_and_types() -> None:
    marks = tuple(ReporterWatermark(f"w{i}", 1, 1) for i in range(HANDOVER_WATERMARKS_MAX + 1))
    with pytest.raises(MessageError) as info:
        KeyHandover(K, 0, 1, 1, marks)
    assert info.value.field == "watermarks"
    with pytest.raises(MessageTypeError):
        Handover("c", 1, [KeyHandover(K, 0, 1, 1)])  # type: ignore[arg-type]
    with pytest.raises(MessageTypeError):
        KeyHandover(("t", "read_iops", 1), 0, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(MessageError):
        from_wire([SCHEMA_VERSION, "handover", "c", 1])  # too few fields


# -- a member's forged debt ------------------------------------------------------


@pytest.mark.parametrize("opened_first", [False, True])
def test_a_forged_debt_is_believed_only_up_to_an_honest_owners(opened_first: bool) -> None:
    """c is a member and owns K: its hand-over is taken, but a debt of centuries starves
    the key only for as long as an honest meter could be behind (B + N*b + R*d over R)."""
    fast = policy("*", rate=1000, burst=100, b=20)
    a = receiver(fast)
    a.ring_changed(A_NOW, RING2)
    forged = Handover("c", RING2.epoch, (KeyHandover(K, INT_MAX, INT_MAX, INT_MAX),))
    t = A_NOW + 200 * MS  # past a full refill: a key opened now opens full
    if opened_first:
        a.receive(t, report(K, "x", 1, 1, ring_epoch=RING2.epoch))
        a.take_handover(t, forged)
    else:
        a.take_handover(t, forged)
        a.receive(t, report(K, "x", 1, 1, ring_epoch=RING2.epoch))
    ks = a.keys[K]
    cap = ahead_max_ns(ks, len(RING3))
    # (B + N*b)/R = (100 + 5*20)/1000 s (N: the five members), and one claim window of the rate
    window_ns = a.config.snapshot_ttl_ns + a.config.report_retry_max_ms * MS
    window_ns += 2 * a.config.sync_interval_ns
    assert len(RING3) == 5 and cap == 200 * MS + window_ns
    assert ks.meter.remaining(t) == 0
    assert ks.meter.ahead_ns(t) <= cap + NS_PER_S // 1000  # + the report of 1 unit
    later = t + cap + NS_PER_S // 1000
    assert ks.meter.remaining(later) > 0  # refilling again, not in 292 years
    assert ks.owner_epoch <= ORDER_MAX and ks.version <= ORDER_MAX + 1  # + its snapshot

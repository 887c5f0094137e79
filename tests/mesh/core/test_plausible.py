"""Plausible usage only: the owner refuses what its sender could not have sent.

Reports from a sender outside the ring are refused whole; a member's report claiming more
than the key's rate allows (plus the stated tolerance), or refunding more than it reported,
is refused (acknowledged, nothing applied); no value from a peer makes a later hand-over
fail. `mesh.core.owner._plausible` states the rules and the tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.core._validate import INT_MAX
from mesh.core.config import CoreConfig
from mesh.core.effects import Effect, Send
from mesh.core.gcra import NS_PER_S, Gcra
from mesh.core.messages import (
    Handover,
    KeyHandover,
    ReportBatch,
    ReporterWatermark,
    SnapshotBatch,
    UsageReport,
    decode,
    encode,
)
from mesh.core.owner import Owner, Refusal
from mesh.core.owner._plausible import claim_tolerance
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from tests.mesh._helpers import MS, cache, policy

RING = Ring(["o", "w"], 1)
NOW = 10_000 * MS  # the owner has held its position long enough: keys start full


def _key_of(p_tenant: str) -> str:
    """A tenant whose keys `o` owns in RING (so a member's reports are taken)."""
    for i in range(10_000):
        t = f"{p_tenant}{i}"
        if RING.owns("o", RateKey(t, Metric.READ_IOPS, 1)) and RING.owns(
            "o", RateKey(t, Metric.CLIENT_INGRESS_BYTES, 1)
        ):
            return t
    raise AssertionError("no such tenant")


T = _key_of("t")
P = policy(T, rate=1000, burst=100, b=20)
PB = policy(T, rate=1_000_000, burst=65_536, b=16_384, metric="client_ingress_bytes")
KEY, BKEY = P.rate_key, PB.rate_key
TOL = claim_tolerance(P, CoreConfig()) // NS_PER_S  # units: b + B + R x window


def owner() -> Owner:
    return Owner("o", RING, cache(P, PB), 0)


def report(sender: str, seq: int, delta: int, key: RateKey = KEY, epoch: int = 1) -> ReportBatch:
    if key.metric == Metric.CLIENT_INGRESS_BYTES:
        r = UsageReport(key, sender, epoch, seq, byte_delta=delta, unacked_from=seq)
    else:
        r = UsageReport(key, sender, epoch, seq, iops_delta=delta, unacked_from=seq)
    return ReportBatch.of(sender, RING.epoch, [r])


def acks(effects: Sequence[Effect], to: str) -> list[int]:
    return [
        s.ack_sequence_for_receiver
        for e in effects
        if isinstance(e, Send) and e.to == to and isinstance(e.message, SnapshotBatch)
        for s in e.message.snapshots
    ]


def leave(o: Owner, now_ns: int) -> list[Handover]:
    """The owner hands over (to `w`) and every message still encodes and decodes."""
    out = []
    for e in o.hand_over(now_ns, Ring(["w"], 1)):
        assert isinstance(e, Send) and isinstance(e.message, Handover)
        assert decode(encode(e.message)) == e.message
        out.append(e.message)
    return out


# -- a sender outside the ring ---------------------------------------------------------------


def test_a_strangers_batch_is_refused_whole_and_changes_nothing() -> None:
    o = owner()
    o.receive(NOW, report("w", 1, 5))
    before = (o.applied_units, o.keys[KEY].meter.tat_scaled, dict(o._leases))
    effects = o.receive(NOW + MS, report("mallory", 1, INT_MAX))
    assert effects == []  # no reply, no rejection: nothing for a stranger
    assert (o.applied_units, o.keys[KEY].meter.tat_scaled, dict(o._leases)) == before
    assert "mallory" not in o.keys[KEY].reporters
    assert o.refused == {"not_member": 1, "over_claim": 0, "over_refund": 0, "bad_watermark": 0}
    assert o.refused_n == 1
    assert leave(o, NOW + 2 * MS)  # leaving still works


def test_no_switch_turns_the_membership_check_off() -> None:
    """The owner takes reports from members only, with no constructor flag to take them
    from anyone (tests build rings holding their workers instead)."""
    import inspect

    assert list(inspect.signature(Owner).parameters) == [
        "member_id",
        "ring",
        "policies",
        "now_ns",
        "incarnation",
        "config",
    ]


def test_a_member_that_left_may_report_within_the_grace_then_not() -> None:
    o = owner()
    o.ring_changed(NOW, Ring(["o"], 2))  # w left
    assert acks(o.receive(NOW + MS, report("w", 1, 1)), "w") == [1]  # moves in flight
    late = NOW + 11 * NS_PER_S
    assert o.receive(late, report("w", 2, 1)) == []
    assert o.refused[Refusal.NOT_MEMBER] == 1 and o.applied_units == 1


def test_a_strangers_handover_is_refused_and_counted() -> None:
    o = owner()
    item = KeyHandover(KEY, INT_MAX, INT_MAX, INT_MAX, (ReporterWatermark("w", 1, INT_MAX),))
    o.take_handover(NOW, Handover("mallory", 1, (item,)))
    assert not o.handovers.pending and o.refused[Refusal.NOT_MEMBER] == 1


# -- over-claims -----------------------------------------------------------------------------


def test_a_members_huge_claim_is_refused_acknowledged_and_changes_nothing() -> None:
    o = owner()
    o.receive(NOW, report("w", 1, 5))
    tat = o.keys[KEY].meter.tat_scaled
    effects = o.receive(NOW + MS, report("w", 2, INT_MAX))
    assert acks(effects, "w") == [2]  # seen: an honest worker would not resend it forever
    assert o.keys[KEY].meter.tat_scaled == tat and o.applied_units == 5
    assert o.refused[Refusal.OVER_CLAIM] == 1
    assert o.receive(NOW + MS, report("w", 2, INT_MAX))  # a resend: a duplicate, no recount
    assert o.refused[Refusal.OVER_CLAIM] == 1 and o.duplicates == 1
    o.receive(NOW + 2 * MS, report("w", 3, 7))  # later honest usage still counts
    assert o.applied_units == 12
    assert leave(o, NOW + 3 * MS)


def test_only_the_implausible_row_of_a_batch_is_refused() -> None:
    o = owner()
    rows = [
        UsageReport(KEY, "w", 1, 1, iops_delta=TOL + 1),
        UsageReport(BKEY, "w", 1, 1, byte_delta=10),
    ]
    o.receive(NOW, ReportBatch.of("w", 1, rows))
    assert o.applied == {KEY: 0, BKEY: 10}
    assert o.refused[Refusal.OVER_CLAIM] == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200 * MS), st.integers(0, 400)), max_size=60))
def test_claims_conforming_to_the_rate_and_tolerance_are_never_refused(
    steps: list[tuple[int, int]],
) -> None:
    """Any history an honest worker could produce (usage within R x t + tolerance over every
    interval, as a GCRA at R with that burst admits it) is taken whole."""
    o = owner()
    honest = Gcra(P.target_rate, TOL, NOW)
    now, seq, taken = NOW, 0, 0
    for dt, want in steps:
        now += dt
        if not honest.try_take(now, want) or want == 0:
            continue
        seq += 1
        o.receive(now, report("w", seq, want))
        taken += want
    assert o.refused_n == 0 and o.applied_units == taken


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200 * MS), st.integers(-(2**63) + 1, 2**63 - 1))))
def test_what_is_taken_never_runs_past_the_rate_plus_tolerance(
    steps: list[tuple[int, int]],
) -> None:
    """Whatever a member claims, what the owner applies from it over any interval stays within
    R x interval + tolerance, its refunds never exceed what it had applied, and the owner can
    still hand the key over."""
    o = owner()
    now, seq = NOW, 0
    applied: list[tuple[int, int]] = []  # (time, units) taken
    for dt, delta in steps:
        now += dt
        seq += 1
        before = o.applied_units
        o.receive(now, report("w", seq, delta))
        took = o.applied_units - before
        assert took in (0, delta)
        assert o.applied_units >= 0  # never refunded past what it reported
        if took:
            applied.append((now, took))
    for i, (t0, _) in enumerate(applied):
        net = 0
        for t1, units in applied[i:]:
            net += units
            assert net <= P.target_rate * (t1 - t0) // NS_PER_S + TOL
    leave(o, now + MS)


# -- refunds ---------------------------------------------------------------------------------


def test_a_refund_never_exceeds_what_the_sender_had_applied() -> None:
    o = owner()
    o.receive(NOW, report("w", 1, 1000, BKEY))
    o.receive(NOW, report("w", 2, -1001, BKEY))  # more than it reported
    assert o.applied[BKEY] == 1000 and o.refused[Refusal.OVER_REFUND] == 1
    o.receive(NOW, report("w", 3, -400, BKEY))  # a short send: taken
    o.receive(NOW, report("w", 4, -600, BKEY))
    o.receive(NOW, report("w", 5, -1, BKEY))
    assert o.applied[BKEY] == 0 and o.refused[Refusal.OVER_REFUND] == 2


def test_a_refund_flood_does_not_refill_the_meter() -> None:
    o = owner()
    o.receive(NOW, report("o", 1, 150))  # the owner's own worker spends past the burst
    left = o.keys[KEY].meter.remaining(NOW)
    assert left == 0
    for seq in range(1, 50):  # another member refunds what it never reported
        o.receive(NOW + seq * MS // 10, report("w", seq, -1_000_000))
    assert o.keys[KEY].meter.remaining(NOW + 5 * MS) == 0
    assert o.refused[Refusal.OVER_REFUND] == 49


# -- saturation ------------------------------------------------------------------------------


def test_a_members_extreme_handover_cannot_make_a_later_leave_fail() -> None:
    """A member that owned the key hands over the largest values the wire allows; the
    receiver then takes reports and leaves in turn: every message still encodes."""
    with_x, without = Ring(["o", "w", "x"], 1), Ring(["o", "w"], 2)
    key = next(
        k
        for i in range(10_000)
        if with_x.owner_of(k := RateKey(f"h{i}", Metric.READ_IOPS, 1)) == "x"
        and without.owner_of(k) == "o"
    )
    o = Owner("o", with_x, cache(P, PB, policy(key.tenant_id)), 0)
    item = KeyHandover(key, INT_MAX, INT_MAX, INT_MAX, (ReporterWatermark("w", 1, INT_MAX),))
    o.take_handover(NOW, Handover("x", 1, (item,)))
    o.take_handover(NOW + 1, Handover("x", 1, (item,)))  # parked twice: the stricter one
    o.ring_changed(NOW + 2, without)  # x left
    o.receive(NOW + 3, report("o", 1, 5, key))
    ks = o.keys[key]
    for _ in range(10):
        o.receive(NOW + 4, report("o", 1, 5, key))  # replies bump the version
    assert ks.version <= INT_MAX
    msgs = leave(o, NOW + 5)
    handed = [k for m in msgs for k in m.keys if k.rate_key == key]
    assert handed and 0 < handed[0].ahead_ns <= INT_MAX

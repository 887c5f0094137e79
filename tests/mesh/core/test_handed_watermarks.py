"""Reporters' watermarks a leaving owner hands over are believed only as far as the leaver
could know them (`mesh.core.owner._handover`): a lying leaver cannot have a
reporter's future reports taken as duplicates (usage never counted)."""

from __future__ import annotations

from collections.abc import Sequence

from mesh.core.config import CoreConfig
from mesh.core.effects import Send
from mesh.core.gcra import NS_PER_S
from mesh.core.messages import (
    Handover,
    KeyHandover,
    ReportBatch,
    ReporterWatermark,
    SnapshotBatch,
    decode,
    encode,
)
from mesh.core.owner import Owner
from mesh.core.owner._handover import HANDED_MARK_TTL_NS, ahead_max_ns
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from tests.mesh._helpers import MS, cache, policy

P = policy("*", rate=10, burst=100, b=20)
RING3 = Ring(["a", "c", "w"], 1)  # c leaves; w reports
RING2 = RING3.with_members(["a", "w"])
NOW = 5_000 * NS_PER_S
INFLIGHT = CoreConfig().inflight_reports_max


def moving() -> RateKey:
    for i in range(10_000):
        k = RateKey(f"t{i}", Metric.READ_IOPS, 1)
        if RING3.owner_of(k) == "c" and RING2.owner_of(k) == "a":
            return k
    raise AssertionError("no such key")


K = moving()


def report(seq: int, delta: int, *, epoch: int = 1, unacked_from: int | None = None) -> ReportBatch:
    floor = seq if unacked_from is None else unacked_from
    return ReportBatch("w", RING2.epoch, epoch, (K,), (seq,), (delta,), (0,), (floor,))


def handed(*marks: ReporterWatermark, ahead_ns: int = 0) -> Handover:
    """What a leaver `c` (lying or not) sends `a`, decoded as `a` would."""
    msg = decode(encode(Handover("c", RING3.epoch, (KeyHandover(K, ahead_ns, 1, 1, marks),))))
    assert isinstance(msg, Handover)
    return msg


def receiver(msg: Handover) -> Owner:
    a = Owner("a", RING3, cache(P), 0)
    a.take_handover(NOW, msg)
    a.ring_changed(NOW, RING2)
    return a


def remaining(effects: Sequence[object]) -> int:
    rows = [
        r
        for e in effects
        if isinstance(e, Send) and isinstance(e.message, SnapshotBatch)
        for r in e.message.snapshots
    ]
    return rows[-1].remaining


def test_an_honest_watermark_makes_in_flight_resends_duplicates() -> None:
    a = receiver(handed(ReporterWatermark("w", 1, 5)))
    # w had 4 and 5 in flight (acks lost) and sends 6: 4 and 5 are in the handed state.
    for seq in (4, 5):
        a.receive(NOW + MS, report(seq, 10, unacked_from=4))
    assert a.duplicates == 2 and a.applied_units == 0
    a.receive(NOW + MS, report(6, 10, unacked_from=4))
    assert a.applied_units == 10 and a.refused["bad_watermark"] == 0


def test_a_watermark_past_what_the_reporter_can_have_sent_is_not_believed() -> None:
    a = receiver(handed(ReporterWatermark("w", 1, 10**12)))
    a.receive(NOW + MS, report(3, 10, unacked_from=3))  # the most w can have sent: 3 + 7
    a.receive(NOW + MS, report(4, 10, unacked_from=3))
    assert a.applied_units == 20 and a.duplicates == 0
    assert a.refused["bad_watermark"] == 1
    assert a.keys[K].reporters["w"].watermark == 4


def test_a_watermark_just_within_the_in_flight_window_is_believed() -> None:
    top = 3 - 1 + INFLIGHT  # w holds at most INFLIGHT unacknowledged reports from 3
    a = receiver(handed(ReporterWatermark("w", 1, top)))
    a.receive(NOW + MS, report(3, 10, unacked_from=3))
    assert a.duplicates == 1 and a.refused["bad_watermark"] == 0
    b = receiver(handed(ReporterWatermark("w", 1, top + 1)))
    b.receive(NOW + MS, report(3, 10, unacked_from=3))
    assert b.duplicates == 0 and b.applied_units == 10 and b.refused["bad_watermark"] == 1


def test_a_watermark_of_an_incarnation_the_reporter_never_had_is_not_believed() -> None:
    a = receiver(handed(ReporterWatermark("w", 99, 1)))  # w is incarnation 1
    a.receive(NOW + MS, report(1, 10))
    a.receive(NOW + MS, report(2, 10, unacked_from=1))
    assert a.applied_units == 20 and a.refused["bad_watermark"] == 1
    assert a.keys[K].reporters["w"].worker_epoch == 1


def test_a_watermark_of_an_older_incarnation_gives_way_to_the_restarted_reporter() -> None:
    a = receiver(handed(ReporterWatermark("w", 1, 50)))
    a.receive(NOW + MS, report(1, 10, epoch=2))  # w restarted: its sequences start again
    assert a.applied_units == 10 and a.refused["bad_watermark"] == 0


def test_a_handed_watermark_expires() -> None:
    a = receiver(handed(ReporterWatermark("w", 1, 5)))
    a.receive(NOW + HANDED_MARK_TTL_NS + MS, report(5, 10, unacked_from=5))
    assert a.duplicates == 0 and a.applied_units == 10
    assert a.refused["bad_watermark"] == 0  # late, not a lie


def test_a_watermark_for_a_non_member_makes_no_record() -> None:
    a = receiver(handed(ReporterWatermark("mallory", 1, 5), ReporterWatermark("w", 1, 1)))
    a.receive(NOW + MS, report(2, 1, unacked_from=2))
    assert set(a.keys[K].reporters) == {"w"}


def test_a_watermark_for_a_known_reporter_rises_at_most_to_what_it_saw() -> None:
    """The key is open at `a` (w reported 1, then 3 past a gap): a handed 10**12 fills the
    gap (2 went to the leaver) and no further."""
    a = Owner("a", RING2, cache(P), 0)
    a.receive(NOW, report(1, 1))
    a.receive(NOW, report(3, 1, unacked_from=1))
    a.handovers.departed["c"] = NOW  # c just left
    a.take_handover(NOW + MS, handed(ReporterWatermark("w", 1, 10**12)))
    rs = a.keys[K].reporters["w"]
    assert rs.watermark == 3 and not rs.above
    a.receive(NOW + 2 * MS, report(4, 1, unacked_from=4))
    assert a.applied_units == 3


def test_handed_debt_is_saturated_and_a_later_leave_still_works() -> None:
    """A forged debt of INT_MAX is believed up to an honest owner's (`ahead_max_ns`); the
    key then hands over again, with values the wire takes."""
    from mesh.core._validate import INT_MAX

    a = receiver(handed(ahead_ns=INT_MAX))
    a.receive(NOW + MS, report(1, 0))
    ks = a.keys[K]
    assert ks.meter.ahead_ns(NOW + MS) <= ahead_max_ns(ks, len(RING3))
    out = a.hand_over(NOW + 2 * MS, Ring(["w"], 9))
    assert out and all(decode(encode(e.message)) for e in out if isinstance(e, Send))
    assert remaining(a.receive(NOW + 40 * NS_PER_S, report(2, 1))) > 0  # it drained

"""What an owner applied of a worker's reports (`SnapshotBatch.applied_net`), and the
worker's count of what was acknowledged and never applied (`GlobalGate.unapplied`), which
its excess estimate adds to what is unacknowledged (`excess_estimate`)."""

from __future__ import annotations

import dataclasses

from mesh.core.admission import Admission
from mesh.core.effects import Send
from mesh.core.messages import ReportBatch, SnapshotBatch, UsageReport
from mesh.core.owner import Owner
from mesh.core.reporter import GlobalGate, Reporter, excess_estimate
from mesh.core.ring import Ring
from tests.mesh._helpers import MS, cache
from tests.mesh.core.test_reporter import KEY, P, admit_n, snap, worker


def said(batch: SnapshotBatch, net: int) -> SnapshotBatch:
    return dataclasses.replace(batch, applied_net=(net,))


def opened(net: int) -> tuple[Reporter, Admission, GlobalGate]:
    """A worker whose view reported 1 unit (sequence 1), acknowledged by an owner whose
    record of it says `net` applied: where the comparison starts."""
    r, a = worker()
    assert admit_n(a, 1) == 1
    r.flush(0)
    r.receive(0, said(snap(100, 1, 1), net))
    v = r.gates[KEY]
    assert v.unacked == 0 and v.unapplied == 0 and v.net_from == ("o", 1, 0)
    return r, a, v


def test_usage_acknowledged_and_applied_leaves_nothing_unapplied() -> None:
    r, a, v = opened(1)
    admit_n(a, 5)
    r.flush(1)
    r.receive(2, said(snap(95, 2, 2), 6))
    assert v.unacked == 0 and v.unapplied == 0


def test_usage_acknowledged_and_not_applied_is_unapplied() -> None:
    r, a, v = opened(40)  # a record holding an earlier view's usage
    admit_n(a, 5)
    r.flush(1)
    r.receive(2, said(snap(100, 2, 2), 40))  # acknowledged (a "duplicate"), applied: none
    assert v.unacked == 0 and v.unapplied == 5 * v.scale
    est, bound = excess_estimate(v, 4, 0)
    assert est == 5 * v.scale + 3 * min(5 * v.scale, P.local_burst_cap)
    admit_n(a, 3)
    r.flush(3)
    r.receive(4, said(snap(97, 3, 3), 43))  # this one applied: the count stays
    assert v.unapplied == 5 * v.scale


def test_a_record_begun_again_or_a_new_owner_is_not_taken_for_loss() -> None:
    r, a, v = opened(500)
    admit_n(a, 5)
    r.flush(1)
    r.receive(2, said(snap(95, 2, 2), 2))  # the owner forgot us; its new record applied 2
    assert v.unapplied == 0
    admit_n(a, 4)
    r.flush(3)
    other = dataclasses.replace(said(snap(96, 3, 3), 7), sender="o2", owner_incarnation=9)
    r.receive(4, other)  # another owner (or incarnation): compared from here on
    assert v.unapplied == 0 and v.net_from == ("o2", 1, 9)


def test_an_owner_that_does_not_say_leaves_the_estimate_as_it_was() -> None:
    r, a = worker()
    admit_n(a, 5)
    r.flush(1)
    r.receive(2, snap(100, 1, 1))
    v = r.gates[KEY]
    assert v.unacked == 0 and v.unapplied == 0 and v.net_from is None


def test_an_idle_view_starts_its_count_again() -> None:
    r, a, v = opened(40)
    admit_n(a, 5)
    r.flush(1)
    r.receive(2, said(snap(100, 2, 2), 40))
    assert v.unapplied > 0
    r.tick(2 + r.config.snapshot_ttl_ns + 1)  # expired with nothing in flight: it boots
    assert v.unapplied == 0 and v.net_from is None


def test_owner_rows_say_what_it_applied_of_the_receiver_and_not_duplicates() -> None:
    ring = Ring(["o", "w"], 1)
    o = Owner("o", ring, cache(P), 10_000 * MS)
    now = 20_000 * MS

    def send(seq: int, delta: int, unacked_from: int = 1) -> tuple[int, int]:
        rep = UsageReport(KEY, "w", 3, seq, iops_delta=delta, unacked_from=unacked_from)
        out = o.receive(now, ReportBatch.of("w", 1, [rep]))
        (batch,) = [
            e.message for e in out if isinstance(e, Send) and isinstance(e.message, SnapshotBatch)
        ]
        return batch.acks[0], batch.applied_net[0]

    assert send(1, 5) == (1, 5)
    assert send(2, 3) == (2, 8)
    assert send(2, 3) == (2, 8)  # a resend: seen before, nothing applied
    assert send(1, 9) == (2, 8)  # a new report under a used number: acknowledged, not applied
    assert send(3, -2) == (3, 6)  # a refund lowers it

"""The node's count of units admitted per limit (mesh/node/_units.py), driven through a real
core Member: each report counted once however often it is resent, local views counted at
their settle, idle views folded into totals that never go down."""

from __future__ import annotations

from mesh.core.effects import Effect, Send
from mesh.core.member import Member
from mesh.core.messages import ReportBatch
from mesh.core.policy import Mode, PolicyCache, TenantRatePolicy
from mesh.core.ring import Ring
from mesh.node._units import AdmittedUnits

MS = 1_000_000


def member(*policies: TenantRatePolicy) -> Member:
    return Member("w1", 1, Ring(["w1", "w2"], 1), PolicyCache(policies), 0)


def carry(m: Member, units: AdmittedUnits, effects: list[Effect]) -> list[int]:
    """What the node's `_carry` does with our reports; returns the sequences sent."""
    sent: list[int] = []
    for e in effects:
        if isinstance(e, Send) and isinstance(e.message, ReportBatch):
            units.reported(m.reporter.gates, e.message)
            sent.extend(e.message.sequences)
    return sent


def tick(m: Member, units: AdmittedUnits, now_ns: int) -> list[int]:
    units.settling(m.admission)  # as the node's ticker: just before the tick
    return carry(m, units, m.tick(now_ns))


def test_a_report_is_counted_once_however_often_it_is_resent() -> None:
    m, units = member(TenantRatePolicy("acme", "read_iops", 1, 1000, 100, 20)), AdmittedUnits()
    for _ in range(5):
        assert m.admission.try_admit("acme", "read_iops").allowed
    sent = tick(m, units, 5 * MS)
    # Never acknowledged (w2 owns it and is not there): resent on its timer, and again
    # after a ring change, which starts its send count afresh.
    for t in range(2, 400):
        sent += tick(m, units, t * 5 * MS)
    m.ring_changed(400 * 5 * MS, Ring(["w1", "w2", "w3"], 2))
    for t in range(401, 420):
        sent += tick(m, units, t * 5 * MS)
    assert sent.count(1) >= 3  # the one report went out again and again
    assert units.by_limit() == {("acme", "read_iops", "global"): 5}
    assert units.totals() == {("read_iops", "global"): 5}


def test_local_views_are_counted_at_their_settle_and_idle_ones_fold_into_totals() -> None:
    local = TenantRatePolicy("*", "write_iops", 1, 100, 10, 10, mode=Mode.LOCAL)
    m, units = member(local), AdmittedUnits()
    for tenant in ("a", "b"):
        for _ in range(4):
            m.admission.try_admit(tenant, "write_iops", 2)
    tick(m, units, 5 * MS)
    assert units.by_limit() == {("a", "write_iops", "local"): 8, ("b", "write_iops", "local"): 8}
    m.admission.try_admit("a", "write_iops")
    tick(m, units, 10 * MS)
    units.forget_idle()  # remembered as they are
    units.forget_idle()  # neither moved since: dropped, their counts kept per (metric, mode)
    assert units.by_limit() == {}
    assert units.totals() == {("write_iops", "local"): 17}

"""Rates that are not a whole number per second, metered exactly in sub-units.

`"5000/minute"` is 250/3 per second: the policy keeps scale 3 sub-units per unit, a rate of
250 sub-units per second and bursts times 3, and only the admission views convert
(mesh/core/gate.py). Local mode with an explicit clock, a hypothesis property over random
rates, and global mode through an in-memory two-member fleet.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.core.admission import Admission, CreditDesk, StrictGate
from mesh.core.effects import ReserveCredit
from mesh.core.gcra import NS_PER_S
from mesh.core.member import Member
from mesh.core.policy import Mode, PolicyCache, TenantRatePolicy
from mesh.core.ring import Ring
from mesh.core.verdict import Reason
from mesh.testing.fleet import MemoryFleet, Offered, drive
from ratemesh.credit import CreditConfig
from ratemesh.rates import PERIODS_S

MS = 1_000_000


def rated(rate: int | str, burst: int, cap: int, mode: Mode = Mode.GLOBAL) -> TenantRatePolicy:
    """acme/requests at `rate` (text as in a policy file), through `from_dict`."""
    return TenantRatePolicy.from_dict(
        {
            "tenant_id": "acme",
            "metric": "requests",
            "generation": 1,
            "target_rate": rate,
            "global_burst": burst,
            "local_burst_cap": cap,
            "mode": mode.value,
        }
    )


PER_MINUTE = rated("5000/minute", 10, 5, Mode.LOCAL)


def drain(a: Admission, tenant: str = "acme", metric: str = "requests") -> int:
    """Admit one unit at a time until denied; how many were admitted."""
    n = 0
    while a.try_admit(tenant, metric).allowed:
        n += 1
    return n


def test_the_policy_keeps_sub_units_and_writes_back_what_was_written() -> None:
    p = PER_MINUTE
    assert (p.scale, p.target_rate, p.global_burst, p.local_burst_cap) == (3, 250, 30, 15)
    assert (p.limit_per_s, p.burst_units) == (83, 10)
    d = p.to_dict()
    assert (d["target_rate"], d["global_burst"], d["local_burst_cap"]) == ("5000/minute", 10, 5)
    assert "scale" not in d
    assert TenantRatePolicy.from_dict(d) == p
    assert replace(p, generation=2).values() == p.values()  # a copy keeps its sub-units
    assert p.for_tenant("beta").values() == p.values()


def test_a_whole_rate_per_second_is_the_policy_it_was() -> None:
    for rate in (100, "100", "100/second", "6000/minute"):
        p = rated(rate, 10, 5)
        assert p.scale == 1 and p.target_rate == 100
        assert p.to_dict() == {
            "tenant_id": "acme",
            "metric": "requests",
            "generation": 1,
            "target_rate": 100,
            "global_burst": 10,
            "local_burst_cap": 5,
            "enabled": True,
            "mode": "global",
        }


def test_5000_per_minute_admits_exactly_5000_a_minute_plus_the_burst_locally() -> None:
    a = Admission(PolicyCache([PER_MINUTE]), 0)
    admitted = drain(a)
    assert admitted == 10  # the burst, in units
    for t in range(5 * MS, 60 * NS_PER_S + 1, 5 * MS):
        a.tick(t)
        admitted += drain(a)
    assert admitted == 5000 + 10
    # (at 83 or 84 a second it would have been 4990 or 5050): a unit every 12 ms since
    a.tick(60 * NS_PER_S + 11 * MS)
    assert drain(a) == 0
    a.tick(60 * NS_PER_S + 12 * MS)
    assert drain(a) == 1


def test_the_verdict_numbers_are_in_units() -> None:
    a = Admission(PolicyCache([PER_MINUTE]), 0)
    drain(a)
    v = a.try_admit_detailed("acme", "requests", now_ns=0)
    assert not v.allowed and v.limit == 83  # units per second, rounded down
    assert v.remaining == 0
    assert v.retry_after_ms == 12  # one unit every 60/5000 s
    a.tick(30 * MS)  # 2.5 units refilled: 2 whole
    ok = a.try_admit_detailed("acme", "requests", now_ns=30 * MS)
    assert ok.allowed and ok.remaining == 1
    too_big = a.try_admit("acme", "requests", 11)
    assert too_big.reason is Reason.TOO_LARGE
    a.refund("acme", "requests", 1)  # given back in units
    assert a.gate("acme", "requests").avail == 2  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 400),
    n=st.integers(1, 30),
    unit=st.sampled_from(["ms", "s", "minute", "h"]),
    burst=st.integers(1, 40),
    gaps=st.lists(st.integers(1, 1_000), min_size=1, max_size=60),
    offered=st.integers(0, 3),
)
def test_admitted_never_exceeds_the_rate_and_the_burst_and_reaches_it(
    count: int, n: int, unit: str, burst: int, gaps: list[int], offered: int
) -> None:
    """Over [0, T] a local limit admits at most count*T/period + burst, and exactly that
    (rounded down) when demand always exceeds it and no tick gap overfills the bucket: a
    gap that refills at most burst - 1 units (what is left after a drain is under one)."""
    text = f"{count}/{n}{unit}"
    p = rated(text, burst, 1, Mode.LOCAL)
    rate = Fraction(count) / (PERIODS_S[unit] * n)  # units per second
    span_ns = max(1, burst - 1) / rate * NS_PER_S  # refills burst - 1 units
    a = Admission(PolicyCache([p]), 0)
    admitted = drain(a)
    t = 0
    overfilled = False
    for g in gaps:  # a gap is a fraction (per mille) of the span, or of 3 spans
        gap = max(1, int(span_ns * g * (1 + 2 * (offered == 0)) / 1000))
        overfilled |= gap * rate / NS_PER_S > burst - 1
        t += gap
        a.tick(t)
        admitted += drain(a)
        bound = rate * t / NS_PER_S + burst
        assert admitted <= bound, (text, burst, t, admitted)
    if not overfilled:
        assert admitted == int(rate * t / NS_PER_S + burst), (text, burst, t)


def test_share_mode_splits_sub_units() -> None:
    p = replace(PER_MINUTE, mode=Mode.SHARE)
    a = Admission(PolicyCache([p]), 0, n_live=2)
    admitted = drain(a)
    for t in range(5 * MS, 60 * NS_PER_S + 1, 5 * MS):
        a.tick(t)
        admitted += drain(a)
    assert admitted == 2500 + 5  # half of each, exactly: 125 sub-units a second, burst 15


def test_5000_per_minute_through_a_two_member_fleet() -> None:
    """Global mode: the owner meters 250 sub-units a second; each member admits units.
    Over 120 s at 300/s offered the fleet admits 10,000 (the ideal meter's count without
    the burst it starts with, the owners' conservative start) within N*b + R*d: 83 or 84 a
    second would be 40 or 80 off."""
    p = rated("5000/minute", 50, 10)
    f = MemoryFleet(["w0", "w1"], PolicyCache([p]), seed=5)
    f.run_until(NS_PER_S // 5)  # owners past their conservative start
    d = Offered("acme", 300, metric="requests")
    drive(f, [d], f.now_ns + 120 * NS_PER_S, step_ns=2 * MS)
    envelope = 2 * 10 + 84 * f.propagation_delay_ns() / NS_PER_S
    assert d.ideal == 50 + 9_999  # exact too: it starts one step in, 2 ms short of 10,000
    assert d.max_excess <= envelope, d.report()
    assert abs(d.admitted - 10_000) <= envelope, d.report()
    owner = f.members[f.ring.owner_of(p.rate_key)].owner
    assert p.rate_key in owner.applied


def test_strict_spends_scale_sub_units_of_credit_a_unit() -> None:
    """governord meters the policy in sub-units, so its blocks are sub-units: a unit
    admitted spends `scale` of them, off the inline fast path (amount_max 0)."""
    now = [0]
    desk = CreditDesk(lambda: now[0], CreditConfig())
    p = rated("5000/minute", 100, 20, Mode.STRICT)
    m = Member("w", 1, Ring(["w"], 1), PolicyCache([p]), 0, credit=desk)
    assert m.admission.try_admit("acme", "requests").reason is Reason.NO_CREDIT
    assert m.credit is not None
    (ask,) = [e for e in m.credit.take() if isinstance(e, ReserveCredit)]
    m.credit.granted(ask, 1, 31, 1_000)  # 31 sub-units: 10 units and a third
    g = m.admission.gate("acme", "requests")
    assert isinstance(g, StrictGate) and g.amount_max == 0
    front = g.front
    assert front is not None
    room = min(front.avail, 10)
    admitted = sum(m.admission.try_admit("acme", "requests").allowed for _ in range(room))
    assert admitted == room and g.admitted_now() == room
    assert g.holder.held(0) == 31 - 3 * room
    assert front.pending == room  # the mesh's view is charged in units


@given(
    count=st.integers(1, 10**6),
    n=st.integers(1, 10**4),
    unit=st.sampled_from(["ms", "s", "minute", "h", "d"]),
    burst=st.integers(1, 10**4),
    cap=st.integers(1, 100),
)
def test_the_text_form_round_trips_to_the_same_policy(
    count: int, n: int, unit: str, burst: int, cap: int
) -> None:
    p = rated(f"{count}/{n}{unit}", burst, cap)
    rate = Fraction(count) / (PERIODS_S[unit] * n)
    assert Fraction(p.target_rate, p.scale) == rate and p.scale == rate.denominator
    assert (p.burst_units, p.local_burst_cap) == (burst, cap * p.scale)
    d = p.to_dict()
    assert TenantRatePolicy.from_dict(d) == p
    assert (d["global_burst"], d["local_burst_cap"]) == (burst, cap)
    if p.scale == 1:
        assert d["target_rate"] == p.target_rate  # an integer, as in older releases

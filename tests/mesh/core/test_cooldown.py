"""The fleet-wide 429 cooldown (issue 17): one worker's 429 cools the limit on every worker
that uses it within d, discloses `suspended: cooldown` with the time left, ends on time,
and what peers send about it is checked and bounded."""

from __future__ import annotations

import pytest

from mesh.core.admission import Admission
from mesh.core.admission._admission import COOLDOWNS_MAX
from mesh.core.cooldown import CooldownDesk
from mesh.core.gcra import NS_PER_S
from mesh.core.messages import (
    COOLDOWN_MS_MAX,
    CooldownNotice,
    CooldownReport,
    CooldownRow,
    decode,
    encode,
)
from mesh.core.policy import RateKey
from mesh.core.ring import Ring
from mesh.core.verdict import Reason, Step, Suspension
from mesh.errors import MessageError
from mesh.testing.fleet import MemoryFleet
from tests.mesh._helpers import cache, policy

MS = 1_000_000


def _admit(f: MemoryFleet, member: str, tenant: str) -> None:
    if member in f.members:
        f.try_admit(member, tenant, "read_iops")


def _busy(f: MemoryFleet, tenants: list[str], until_ns: int) -> None:
    """Every member admits a little for each tenant every 5 ms: all are reporters."""
    t = f.now_ns
    while t < until_ns:
        for m in list(f.members):
            for tenant in tenants:
                f.at(t, _admit, f, m, tenant)
        t += 5 * MS
    f.run_until(until_ns)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_429_cools_every_worker_within_d_and_ends_on_time(seed: int) -> None:
    f = MemoryFleet(["a", "b", "c", "d"], cache(policy("*", rate=10_000, burst=1000)), seed=seed)
    _busy(f, ["acme", "other"], 200 * MS)
    reporter = "b"
    start = f.now_ns
    f._carry(
        reporter, f.members[reporter].report_429(f.local_ns(reporter), "acme", "read_iops", 2000)
    )
    assert f.try_admit(reporter, "acme", "read_iops").reason is Reason.COOLDOWN  # at once here
    d = f.propagation_delay_ns()
    _busy(f, ["other"], start + d)
    for m in f.members:
        v = f.try_admit(m, "acme", "read_iops")
        assert not v.allowed, (seed, m)
        assert (
            v.reason is Reason.COOLDOWN
            and v.suspended is Suspension.COOLDOWN
            and v.step is Step.MESH
        )
        adm = f.members[m].admission
        detailed = adm.try_admit_detailed("acme", "read_iops", now_ns=f.local_ns(m))
        assert detailed.retry_after_ms is not None and 0 < detailed.retry_after_ms <= 2000
        assert f.try_admit(m, "other", "read_iops").allowed  # another tenant is untouched
    _busy(f, ["other"], start + 2 * NS_PER_S + 20 * MS)
    for m in f.members:
        assert f.try_admit(m, "acme", "read_iops").allowed, (seed, m)
        assert not f.members[m].admission.cooldowns


def test_a_worker_that_starts_reporting_later_is_told_at_the_owners_tick() -> None:
    f = MemoryFleet(["a", "b", "c"], cache(policy("*", rate=10_000, burst=1000)), seed=5)
    _busy(f, ["acme"], 100 * MS)
    key = RateKey("acme", "read_iops", 1)
    owner = f.ring.owner_of(key)
    late = next(m for m in f.members if m != owner)
    reporter = next(m for m in f.members if m not in (owner, late))
    f.crash(late, notice=False)
    f._carry(
        reporter, f.members[reporter].report_429(f.local_ns(reporter), "acme", "read_iops", 5000)
    )
    f.run_until(f.now_ns + 50 * MS)
    f.restart(late)  # a new incarnation: no view of acme, no cooldown yet
    assert f.try_admit(late, "acme", "read_iops").allowed  # its first use reports
    _busy(f, ["acme"], f.now_ns + f.propagation_delay_ns() + 20 * MS)
    assert f.try_admit(late, "acme", "read_iops").reason is Reason.COOLDOWN


def test_messages_round_trip_and_bad_ones_are_refused() -> None:
    key = RateKey("acme", "read_iops", 1)
    for msg in (
        CooldownReport("a", 3, (CooldownRow(key, 90_000),)),
        CooldownNotice("b", 3, (CooldownRow(key, 1),)),
    ):
        assert decode(encode(msg)) == msg
    for ms in (0, COOLDOWN_MS_MAX + 1, -5):
        with pytest.raises(MessageError, match="ms"):
            CooldownRow(key, ms)
    with pytest.raises(MessageError, match="rows"):
        CooldownReport("a", 1, tuple(CooldownRow(key, 1) for _ in range(257)))


def test_a_notice_from_anyone_but_the_owner_changes_nothing() -> None:
    ring = Ring(["a", "b", "c"], 1)
    key = RateKey("acme", "read_iops", 1)
    not_owner = next(m for m in ring.members if m != ring.owner_of(key))
    adm = Admission(cache(policy("*")), 0)
    desk = CooldownDesk("x")
    desk.notice(0, CooldownNotice(not_owner, 1, (CooldownRow(key, 5000),)), ring, adm)
    assert adm.cooldowns == {} and desk.refused == {"not_owner": 1}
    desk.notice(0, CooldownNotice(ring.owner_of(key), 1, (CooldownRow(key, 5000),)), ring, adm)
    assert adm.cooling_ms("acme", "read_iops", 0) == 5000


def test_cooldowns_are_bounded_and_only_grow() -> None:
    adm = Admission(cache(policy("*")), 0)
    assert adm.cool("t", "read_iops", 10 * NS_PER_S)
    assert adm.cool("t", "read_iops", 1 * NS_PER_S)  # shorter: the longer end stays
    assert adm.cooling_ms("t", "read_iops", 0) == 10_000
    for i in range(COOLDOWNS_MAX - 1):
        assert adm.cool(f"t{i}", "read_iops", NS_PER_S)
    assert not adm.cool("one-more", "read_iops", NS_PER_S)
    assert adm.cooldowns_refused == 1
    adm.tick(2 * NS_PER_S)
    assert list(adm.cooldowns) == [("read_iops", "t")]


def test_an_owner_keeps_no_cooldown_for_a_key_without_a_policy_and_a_clear_ends_one() -> None:
    """A peer's report for a made-up tenant takes no room in the owner's table; the real
    tenant's is kept, and `clear_429` ends it here and in the owner's table."""
    f = MemoryFleet(["a", "b"], cache(policy("acme", rate=10_000, burst=1000)), seed=1)
    _busy(f, ["acme"], 50 * MS)
    real = RateKey("acme", "read_iops", 1)
    owner_id = f.members["a"].ring.owner_of(real)
    owner = f.members[owner_id]
    made_up = [RateKey(f"ghost{i}", "read_iops", 1) for i in range(100)]
    rows = tuple(CooldownRow(k, 60_000) for k in made_up)
    owner.cooldown.receive_report(f.now_ns, CooldownReport("x", 1, rows), owner.ring, owner.owner)
    assert owner.cooldown.until == {} and owner.cooldown.refused.get("no_policy", 0) > 0
    f._carry(owner_id, owner.report_429(f.local_ns(owner_id), "acme", "read_iops", 60_000))
    assert list(owner.cooldown.until) == [real]
    assert f.try_admit(owner_id, "acme", "read_iops").reason is Reason.COOLDOWN
    assert owner.clear_429("acme", "read_iops") is True
    assert owner.cooldown.until == {} and owner.cooldown.cleared == 1
    assert f.try_admit(owner_id, "acme", "read_iops").allowed
    assert owner.clear_429("acme", "read_iops") is False  # nothing left to end
    assert owner.clear_429("ghost1", "read_iops") is False  # no policy: nothing to end

"""Shadow posture against its enforcing twin (docs/policies.md, "Shadow posture").

Two in-memory fleets, one with every limit in shadow and one enforcing the same limits, run
the same traffic on the same seed. A shadow limit meters exactly as enforcing (its bucket
charged only with what it would admit), so at every call its verdict is the twin's,
`shadowed`: admitted, with the twin's reason as `would_deny_reason` where the twin denied,
and its would-deny counts are the twin's denials, call for call and unit for unit.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.core.admission import SHADOW_KEYS_MAX, Admission, WouldDeny
from mesh.core.config import MS
from mesh.core.policy import PolicyCache, TenantRatePolicy
from mesh.core.verdict import Reason, shadowed
from mesh.testing import MemoryFleet
from ratemesh.errors import ConfigError
from ratemesh.policy import Posture
from ratemesh.policyfile import parse_policy_list

TENANTS = ("a", "b", "c")
DEFAULT_TENANTS = ("x", "y")  # no policy by name: the default's, one view each
MEMBERS = ("w0", "w1", "w2")
STEPS_MAX = 120  # milliseconds of traffic per example
RAW = {
    "tenant_id": "a",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 10,
    "global_burst": 5,
    "local_burst_cap": 5,
}

# One step: (milliseconds to advance, member index, tenant index, amount).
_calls = st.lists(
    st.tuples(
        st.integers(0, 3), st.integers(0, 2), st.integers(0, 4), st.sampled_from([1, 1, 2, 5, 40])
    ),
    min_size=1,
    max_size=STEPS_MAX,
)


def _policies(mode: str, posture: Posture) -> PolicyCache:
    """Three tenants by name (c's rate is not whole per second: sub-units) and the default
    policy, which `DEFAULT_TENANTS` spend under."""
    rates: list[int | str] = [200, 300, "12000/minute"]
    return PolicyCache(
        TenantRatePolicy(t, "read_iops", 1, r, 20, 5, mode=mode, posture=posture)  # type: ignore[arg-type]
        for t, r in [*zip(TENANTS, rates, strict=True), ("*", 150)]
    )


@pytest.mark.parametrize("mode", ["local", "share", "global"])
@settings(max_examples=40, deadline=None)
@given(calls=_calls, seed=st.integers(0, 2**16))
def test_shadow_admits_everything_and_counts_the_twins_denials(
    mode: str, calls: list[tuple[int, int, int, int]], seed: int
) -> None:
    shadow = MemoryFleet(MEMBERS, _policies(mode, Posture.SHADOW), seed=seed)
    twin = MemoryFleet(MEMBERS, _policies(mode, Posture.ENFORCE), seed=seed)
    if mode == "share":
        for fleet in (shadow, twin):
            for m in fleet.members.values():
                m.admission.membership(len(MEMBERS), False, fleet.now_ns)
    everyone = (*TENANTS, *DEFAULT_TENANTS)
    denied: dict[str, list[int]] = {t: [0, 0] for t in everyone}
    t_ns = 0
    for step, (advance_ms, w, ti, amount) in enumerate(calls):
        t_ns += advance_ms * MS
        shadow.run_until(t_ns)
        twin.run_until(t_ns)
        member, tenant = MEMBERS[w], everyone[ti]
        got = shadow.try_admit(member, tenant, "read_iops", amount)
        want = twin.try_admit(member, tenant, "read_iops", amount)
        where = f"seed {seed} mode {mode} step {step}"
        assert got.allowed, where
        assert got is shadowed(want), f"{where}: {got} against the twin's {want}"
        assert got.would_deny_reason == (None if want.allowed else want.reason), where
        if not want.allowed:
            denied[tenant][0] += 1
            denied[tenant][1] += amount
    for tenant in everyone:
        counted = [0, 0]
        for m in shadow.members.values():
            c = m.admission.would_deny.of(tenant, "read_iops")
            counted[0] += c.calls
            counted[1] += c.units
        assert counted == denied[tenant], f"seed {seed} mode {mode} tenant {tenant}"
    total = sum(m.admission.would_deny.total().calls for m in shadow.members.values())
    assert total == sum(c for c, _ in denied.values())


def test_a_shadow_local_limit_denies_nothing_and_keeps_its_bucket() -> None:
    """Burst 20 at 200/s: the 21st unit in one tick would be denied; the shadow admits it
    and its bucket stays where the twin's is (a later tick refills both alike)."""
    p = TenantRatePolicy("a", "read_iops", 1, 200, 20, 5, mode="local", posture="shadow")  # type: ignore[arg-type]
    adm = Admission(PolicyCache([p]), 0)
    verdicts = [adm.try_admit("a", "read_iops") for _ in range(25)]
    assert all(verdicts)
    assert [v.would_deny_reason for v in verdicts] == [None] * 20 + [Reason.RATE_LIMITED] * 5
    assert adm.would_deny.of("a", "read_iops") == (5, 5)
    gate = adm.gate("a", "read_iops")
    assert gate is not None and gate.avail == 0  # charged the 20 it would admit, no more
    d = verdicts[-1].to_dict()
    assert d["allowed"] is True and d["shadow"] is True
    assert d["would_deny_reason"] == "rate_limited" and d["reason"] == "admitted"
    assert "shadow" not in dataclasses.replace(verdicts[0], shadow=False).to_dict()
    too_big = adm.try_admit("a", "read_iops", 21)
    assert too_big and too_big.would_deny_reason is Reason.TOO_LARGE


def test_posture_is_written_and_read_back() -> None:
    p = TenantRatePolicy.from_dict(
        {**RAW, "mode": "share", "posture": {"mode": "shadow"}}  # seed 002's spelling
    )
    assert p.shadow and p.to_dict()["posture"] == "shadow"
    assert TenantRatePolicy.from_dict(p.to_dict()) == p
    enforcing = dataclasses.replace(p, posture=Posture.ENFORCE)
    assert "posture" not in enforcing.to_dict() and enforcing.values() != p.values()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"mode": "strict"}, "mode strict"),
        ({"mode": "redis"}, "mode redis"),
        ({"posture": "loud"}, "posture"),
        ({"posture": {"mode": "shadow", "x": 1}}, "posture"),
    ],
)
def test_shadow_where_it_cannot_apply_is_one_clear_error(
    extra: dict[str, object], says: str
) -> None:
    raw = {**RAW, "posture": "shadow", **extra}
    with pytest.raises(ConfigError) as err:
        TenantRatePolicy.from_dict(raw, where="policies[0]")
    assert "policies[0].posture" in str(err.value) and says in str(err.value)


def test_a_whole_generation_in_shadow() -> None:
    """The file's `posture:` applies to every entry that names none."""
    entry = {"metric": "read_iops", "target_rate": 10, "global_burst": 5, "local_burst_cap": 5}
    got = parse_policy_list(
        {
            "posture": "shadow",
            "policies": [
                {**entry, "tenant_id": "a", "generation": 2},
                {**entry, "tenant_id": "b", "generation": 2, "posture": "enforce"},
            ],
        },
        where="policies",
    )
    assert [d.policy.posture for d in got] == [Posture.SHADOW, Posture.ENFORCE]


def test_would_deny_counts_are_bounded_and_forgotten_with_the_view() -> None:
    wd = WouldDeny(keys_max=2)
    for tenant in ("a", "b", "c", "d"):
        wd.add(tenant, "m", "rate_limited", 3)
    assert len(wd.per_tenant) == 3  # a, b, and the rest under "other"
    assert wd.of("other", "m") == (2, 6) and wd.total() == (4, 12)
    wd.forget("a", "m")
    assert wd.of("a", "m") == (0, 0) and wd.total() == (4, 12)
    assert SHADOW_KEYS_MAX >= 1024

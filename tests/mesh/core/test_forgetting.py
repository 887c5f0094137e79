"""Forgetting (part 5): many distinct tenants touched once, then idle, leave no
per-tenant state behind in the views, the reporter or the owner. Counts, never RSS."""

from __future__ import annotations

import pytest

from mesh.core.config import CoreConfig
from mesh.core.effects import Effect, Send
from mesh.core.member import Member
from mesh.core.owner._owner import OTHER_TENANT
from mesh.core.policy import DEFAULT_TENANT
from mesh.core.ring import Ring
from tests.mesh._helpers import MS, cache, policy

TICK_NS = 5 * MS


def carry(m: Member, now_ns: int, effects: list[Effect]) -> None:
    """A one-member fleet: every message goes to ourselves, until there are none."""
    while effects:
        sends = [e for e in effects if isinstance(e, Send)]
        assert all(e.to == m.member_id for e in sends)
        effects = [out for e in sends for out in m.deliver(now_ns, e.message)]


def soak(m: Member, tenants: int, idle_s: float) -> int:
    """Touch `tenants` new tenants once each (a tick every 1000), then let them idle."""
    now = 0
    for i in range(tenants):
        assert m.admission.try_admit(f"t{i}", "read_iops").allowed
        if i % 1000 == 999:
            now += TICK_NS
            carry(m, now, m.tick(now))
    end = now + int(idle_s * 1000) * MS
    while now < end:
        now += TICK_NS
        carry(m, now, m.tick(now))
    return now


def member(mode: str) -> Member:
    cfg = CoreConfig(views_idle_ms=500, idempotency_retention_ms=200)
    pols = cache(policy(DEFAULT_TENANT, mode=mode, rate=1000, burst=100, b=20))
    return Member("w", 1, Ring(["w"], 1), pols, 0, config=cfg)


@pytest.mark.parametrize("mode", ["local", "share", "global"])
def test_tenants_touched_once_then_idle_are_forgotten(mode: str) -> None:
    m = member(mode)
    soak(m, 5000, 2.0)
    assert m.admission.gate_count == 0
    assert m.admission.gates() == []
    assert not m.reporter.gates
    assert not m.owner.keys
    # The owner's telemetry of what forgotten keys applied: one total per metric, and no
    # tenant name kept (a few kept among the many forgotten keep their allocator arenas).
    scopes = m.owner.applied_by_scope()
    assert set(scopes) <= {(OTHER_TENANT, "read_iops")}
    assert sum(scopes.values()) == (5000 if mode == "global" else 0)
    # Used again: rebuilt exactly as new.
    assert m.admission.try_admit("t1", "read_iops").allowed


def test_a_busy_view_is_kept_while_idle_ones_go() -> None:
    m = member("local")
    now = 0
    for i in range(3000):
        m.admission.try_admit(f"t{i}", "read_iops")
    for _ in range(400):  # 2 s; "hot" spends its bucket every tick
        now += TICK_NS
        while m.admission.try_admit("hot", "read_iops").allowed:
            pass
        carry(m, now, m.tick(now))
    assert [v.policy.tenant_id for v in m.admission.gates()] == ["hot"]
    assert m.admission.gate_count == 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "global"])
def test_soak_250000_new_tenants_touched_once_then_idle(mode: str) -> None:
    """The issue's target, counted: 250,000 tenants come and go, the maps shrink back."""
    m = member(mode)
    soak(m, 250_000, idle_s=2.0)
    assert m.admission.gate_count == 0 and not m.admission.gates()
    assert not m.reporter.gates
    assert not m.owner.keys
    assert set(m.owner.applied_by_scope()) <= {(OTHER_TENANT, "read_iops")}

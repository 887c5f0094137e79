"""Credit blocks in the engine: each test is one claim of docs/strict.md, on a manual clock."""

from __future__ import annotations

import json
from typing import Any

import pytest

from governor.engine import (
    ROOT_ID,
    BlockEnd,
    CreditGrant,
    CreditReturn,
    Denial,
    DenyReason,
    Engine,
    EngineConfig,
    InvalidArgument,
    ManualClock,
    NodeState,
    NotFound,
    OutOfScope,
    Rate,
    SessionEnded,
    decode_event,
    encode_event,
)
from governor.engine import _events as ev
from governor.testing.checks import canonical
from tests.governor.engine.test_engine import World as EngineWorld


class World(EngineWorld):
    """The engine tests' world, with credit at hand."""

    def grant(self, sid: int, node: int, units: int, resource: str = "http") -> CreditGrant:
        got = self.engine.reserve_credit(sid, node, resource, units)
        assert isinstance(got, CreditGrant), got
        return got

    def level(self, node: int) -> tuple[int, int]:
        got = self.engine.credit_level(node, "http")
        assert got is not None
        return got[0], got[1]


def test_a_grant_is_the_least_any_node_of_the_chain_allows_and_charges_them_all() -> None:
    w = World()
    tenant = w.node(quotas={"http": 100}, rates={"http": Rate(10, 30)})
    task = w.node(tenant, rates={"http": Rate(100, 12)})
    sid = w.session(tenant)
    g = w.grant(sid, task, 50)
    assert g.units == 12 and g.ttl_ms == 10_000 and g.expires_ms == 11_000
    assert w.level(task) == (0, 12) and w.level(tenant) == (18, 12)
    nodes = w.engine.state.nodes
    assert nodes[tenant].used["http"] == 12 and nodes[ROOT_ID].used["http"] == 12
    # the grant was an event, emitted before the call returned
    assert isinstance(w.events[-1], ev.CreditGranted) and w.events[-1].units == 12


def test_an_empty_bucket_or_a_full_cap_denies_and_names_the_node() -> None:
    w = World()
    tenant = w.node(quotas={"http": 5})
    task = w.node(tenant, rates={"http": Rate(1, 3)})
    sid = w.session(tenant, ttl_ms=60_000)
    assert w.grant(sid, task, 3).units == 3
    n = len(w.events)
    assert w.engine.reserve_credit(sid, task, "http", 1) == Denial(
        DenyReason.RATE, task, "http", 3, 3, 1
    )
    w.clock.advance(2_000)  # 2 units refilled? no: outstanding 3 of burst 3 stops the refill
    assert w.engine.reserve_credit(sid, task, "http", 1) == Denial(
        DenyReason.RATE, task, "http", 3, 3, 1
    )
    assert len(w.events) == n
    w.clock.advance(11_000)  # the block expired: its units stay spent on the cap
    assert w.grant(sid, task, 9).units == 2  # cap 5 - 3; the bucket had refilled to 3
    denial = w.engine.reserve_credit(sid, task, "http", 1)
    assert isinstance(denial, Denial) and denial.reason is DenyReason.QUOTA
    assert denial.node_id == tenant


def test_level_plus_outstanding_never_exceeds_the_burst_and_refills_at_the_rate() -> None:
    w = World()
    node = w.node(rates={"http": Rate(1_000, 100)})
    sid = w.session()
    w.grant(sid, node, 60)
    assert w.level(node) == (40, 60)
    w.clock.advance(1_000)  # 1000 units of refill, but only up to 100 - 60
    assert w.level(node) == (40, 60)
    w.grant(sid, node, 40)
    w.clock.advance(10)
    assert w.level(node) == (0, 100)


def test_a_return_gives_back_the_unused_units_once() -> None:
    w = World()
    tenant = w.node(quotas={"http": 100}, rates={"http": Rate(0, 50)})
    sid = w.session(tenant)
    g = w.grant(sid, tenant, 50)
    first = w.engine.return_credit(sid, g.block_id, 30)
    assert first == CreditReturn(g.block_id, 30, True, BlockEnd.RETURNED)
    assert w.level(tenant) == (30, 0)
    assert w.engine.state.nodes[tenant].used["http"] == 20
    n, before = len(w.events), canonical(w.engine)
    again = w.engine.return_credit(sid, g.block_id, 30)
    assert again == CreditReturn(g.block_id, 30, False, BlockEnd.RETURNED)
    assert len(w.events) == n and canonical(w.engine) == before


def test_a_resent_return_gets_the_first_answer_even_after_a_restore() -> None:
    """A return that straddles a takeover is resent under its request id: applied once, and
    the resend says ``returned`` as the first answer did (a second return would say not)."""
    w = World()
    tenant = w.node(quotas={"http": 100}, rates={"http": Rate(0, 50)})
    sid = w.session(tenant)
    g = w.grant(sid, tenant, 50)
    first = w.engine.return_credit(sid, g.block_id, 30, request_id="ret-1")
    assert first.applied
    n = len(w.events)
    for engine in (w.engine, w.restored()):
        again = engine.return_credit(sid, g.block_id, 30, request_id="ret-1")
        assert again == first
        other = engine.return_credit(sid, g.block_id, 30, request_id="ret-2")
        assert not other.applied
    assert len(w.events) == n
    assert w.engine.state.nodes[tenant].used["http"] == 20


def test_a_block_counts_until_its_ttl_even_after_its_session_ends() -> None:
    """The worker may spend until its local expiry, so the session's end frees nothing."""
    w = World(EngineConfig(credit_ttl_ms=5_000))
    node = w.node(rates={"http": Rate(1_000, 10)})
    sid = w.session(ttl_ms=60_000)
    g = w.grant(sid, node, 10)
    assert g.ttl_ms == 5_000
    w.engine.close_session(sid)
    w.clock.advance(4_999)
    assert w.level(node) == (0, 10)
    w.clock.advance(1)
    assert w.level(node) == (0, 0)  # it stops counting now, and the refill starts now
    w.clock.advance(10)
    assert w.level(node) == (10, 0)
    w.engine.tick()  # the reaper forgets the block
    assert g.block_id not in w.engine.state.credit.blocks


def test_a_block_lives_no_longer_than_its_session_ttl() -> None:
    w = World()
    node = w.node(rates={"http": Rate(1, 10)})
    sid = w.session(ttl_ms=2_000)
    assert w.grant(sid, node, 1).ttl_ms == 2_000


def test_a_late_return_of_an_expired_block_is_a_no_op() -> None:
    w = World()
    node = w.node(rates={"http": Rate(0, 10)})
    sid = w.session(ttl_ms=60_000)
    g = w.grant(sid, node, 10)
    w.clock.advance(10_000)
    n = len(w.events)
    got = w.engine.return_credit(sid, g.block_id, 10)
    assert got == CreditReturn(g.block_id, 10, False, BlockEnd.EXPIRED)
    assert len(w.events) == n and w.level(node) == (0, 0)


def test_a_new_rate_counts_the_blocks_already_out_below_it() -> None:
    w = World()
    tenant = w.node()
    task = w.node(tenant)
    sid = w.session(tenant)
    w.grant(sid, task, 7)
    w.engine.set_rate(None, tenant, "http", Rate(0, 10))
    assert w.level(tenant) == (3, 7)
    w.engine.set_rate(None, tenant, "http", Rate(0, 5))  # lowered below what is out
    assert w.level(tenant) == (0, 7)
    w.engine.set_rate(None, tenant, "http", None)
    assert w.engine.credit_level(tenant, "http") is None


def test_bounds_on_blocks_per_session_deny_without_a_change() -> None:
    w = World(EngineConfig(credit_blocks_per_session_max=2))
    node = w.node(rates={"http": Rate(0, 100)})
    sid = w.session()
    w.grant(sid, node, 1)
    g = w.grant(sid, node, 1)
    denial = w.engine.reserve_credit(sid, node, "http", 1)
    assert isinstance(denial, Denial) and denial.reason is DenyReason.CREDIT_BLOCKS
    w.engine.return_credit(sid, g.block_id, 0)
    w.grant(sid, node, 1)


def test_scope_ownership_and_ended_nodes() -> None:
    w = World()
    a = w.node(rates={"http": Rate(10, 10)})
    b = w.node(rates={"http": Rate(10, 10)})
    sa, sb = w.session(a), w.session(b)
    with pytest.raises(OutOfScope):
        w.engine.reserve_credit(sa, b, "http", 1)
    g = w.grant(sa, a, 1)
    # another session's block answers as an id that is no block at all: no existence oracle
    foreign = w.engine.return_credit(sb, g.block_id, 0)
    assert foreign == CreditReturn(g.block_id, 0, False, BlockEnd.EXPIRED)
    unknown = w.engine.return_credit(sb, 10**6, 0)
    assert unknown == CreditReturn(10**6, 0, False, BlockEnd.EXPIRED)
    assert w.engine.return_credit(sa, g.block_id, 0).applied  # still its owner's to return
    task = w.node(a)
    w.engine.end_node(None, task, NodeState.CANCELLED)
    assert w.engine.reserve_credit(sa, task, "http", 1) == Denial(DenyReason.NODE_ENDED, task)
    w.engine.close_session(sa)
    with pytest.raises(SessionEnded):
        w.engine.reserve_credit(sa, a, "http", 1)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda e, s, n: e.reserve_credit(s, n, "http", 0), "units"),
        (lambda e, s, n: e.reserve_credit(s, n, "http", 10**10), "units"),
        (lambda e, s, n: e.reserve_credit(s, n, "", 1), "resource"),
        (lambda e, s, n: e.reserve_credit(s, "2", "http", 1), "node_id"),
        (lambda e, s, n: e.return_credit(s, "3", 0), "block_id"),
        (lambda e, s, n: e.return_credit(s, 3, -1), "unused"),
        (lambda e, s, n: e.set_rate(None, n, "http", Rate(-1, 5)), "rate.per_s"),
        (lambda e, s, n: e.set_rate(None, n, "http", Rate(1, 0)), "rate.burst"),
        (lambda e, s, n: e.create_node(None, n, "x", rates={"h": (1, 2)}), "rates[h]"),
    ],
)
def test_caller_errors_name_the_field_and_change_nothing(call: Any, field: str) -> None:
    w = World()
    node = w.node(rates={"http": Rate(10, 10)})
    sid = w.session(node)
    w.grant(sid, node, 1)
    before, n = canonical(w.engine), len(w.events)
    with pytest.raises((InvalidArgument, NotFound)) as info:
        call(w.engine, sid, node)
    assert info.value.field == field
    assert canonical(w.engine) == before and len(w.events) == n


def test_returning_more_than_the_block_is_refused() -> None:
    w = World()
    node = w.node(rates={"http": Rate(10, 10)})
    sid = w.session(node)
    g = w.grant(sid, node, 4)
    with pytest.raises(InvalidArgument) as info:
        w.engine.return_credit(sid, g.block_id, 5)
    assert info.value.field == "unused"


def test_a_retried_reserve_returns_the_same_block() -> None:
    w = World()
    node = w.node(rates={"http": Rate(10, 10)})
    sid = w.session(node)
    first = w.engine.reserve_credit(sid, node, "http", 4, request_id="r1")
    n = len(w.events)
    assert w.engine.reserve_credit(sid, node, "http", 4, request_id="r1") == first
    assert len(w.events) == n


def test_replay_and_snapshot_restore_the_buckets_and_blocks() -> None:
    w = World()
    tenant = w.node(quotas={"http": 500}, rates={"http": Rate(20, 40)})
    task = w.node(tenant, rates={"http": Rate(5, 15)})
    sid = w.session(tenant)
    blocks = []
    for i in range(12):
        got = w.engine.reserve_credit(sid, task if i % 2 else tenant, "http", 7)
        if isinstance(got, CreditGrant):
            blocks.append(got)
        if i % 3 == 0 and blocks:
            w.engine.return_credit(sid, blocks.pop(0).block_id, 2)
        w.clock.advance(700)
        w.engine.heartbeat(sid)
    w.engine.set_rate(None, task, "http", Rate(9, 10))
    snap = json.loads(json.dumps(w.engine.snapshot()))
    for event in w.events:
        kind, data = encode_event(event)
        assert decode_event(kind, json.loads(json.dumps(data))) == event
    now = ManualClock(w.clock.now_ms())
    by_events = Engine.restore(None, w.events, now, lambda e: None)
    by_snapshot = Engine.restore(snap, [], now, lambda e: None)
    live = canonical(w.engine)
    live["sessions"] = by_events_sessions = canonical(by_events)["sessions"]
    assert canonical(by_events) == live
    assert canonical(by_snapshot)["credit"] == live["credit"]
    assert by_events_sessions
    for node in (tenant, task):
        assert by_events.credit_level(node, "http") == w.engine.credit_level(node, "http")


def test_an_old_node_created_event_without_rates_still_loads() -> None:
    w = World()
    w.node()
    kind, data = encode_event(w.events[-1])
    del data["rates"]
    event = decode_event(kind, data)
    assert isinstance(event, ev.NodeCreated) and event.rates == {}

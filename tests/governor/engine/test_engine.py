"""Focused behaviour of the engine: each test is one claim of the spec, on a manual clock."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

import governor.engine as gov
from governor.engine import (
    ROOT_ID,
    AdaptiveConfig,
    Consumed,
    Created,
    Defaults,
    Denial,
    DenyReason,
    Engine,
    EngineConfig,
    Event,
    Granted,
    InvalidArgument,
    LeaseEnd,
    ManualClock,
    NodeState,
    NotFound,
    NotOwner,
    OutOfScope,
    Queued,
    Released,
    RequestIdReused,
    SessionEnded,
    UnknownEventKind,
    decode_event,
    encode_event,
)
from governor.testing.checks import canonical


class World:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.clock = ManualClock(1_000)
        self.events: list[Event] = []
        self.engine = Engine(self.clock, self.events.append, config)
        self.n = 0

    def session(self, scope: int = ROOT_ID, ttl_ms: int = 10_000) -> int:
        self.n += 1
        sid, _ = self.engine.open_session(scope, ttl_ms, hashlib.sha256(b"%d" % self.n).hexdigest())
        return sid

    def node(self, parent: int = ROOT_ID, **kw: Any) -> int:
        created = self.engine.create_node(None, parent, kw.pop("name", "n"), **kw)
        assert isinstance(created, Created)
        return created.node_id

    def restored(self) -> Engine:
        return Engine.restore(None, self.events, ManualClock(self.clock.now_ms()), lambda e: None)


# ---- quotas ---------------------------------------------------------------------------------


def test_consume_checks_every_ancestor_and_names_the_cap_and_its_largest_consumer() -> None:
    w = World()
    tenant = w.node(quotas={"http": 150})
    a = w.node(tenant, quotas={"http": 100})
    b = w.node(tenant, quotas={"http": 100})
    sid = w.session()
    assert isinstance(w.engine.consume(sid, a, "http", 90), Consumed)
    denial = w.engine.consume(sid, b, "http", 61)
    assert denial == Denial(DenyReason.QUOTA, tenant, "http", 90, 150, 61, a)
    # all or nothing: b and its ancestors are unchanged
    assert "http" not in w.engine.state.nodes[b].used
    assert w.engine.state.nodes[ROOT_ID].used["http"] == 90
    assert isinstance(w.engine.consume(sid, b, "http", 60), Consumed)


def test_lowering_a_cap_below_usage_takes_nothing_back_and_denies_further_use() -> None:
    w = World()
    t = w.node(quotas={"http": 10})
    sid = w.session()
    w.engine.consume(sid, t, "http", 8)
    w.engine.set_quota(None, t, "http", 5)
    assert w.engine.state.nodes[t].used["http"] == 8
    assert isinstance(w.engine.consume(sid, t, "http", 1), Denial)
    w.engine.set_quota(None, t, "http", None)  # no cap
    assert isinstance(w.engine.consume(sid, t, "http", 1000), Consumed)


def test_retry_budget_is_an_ordinary_quota_and_bounds_layered_retries() -> None:
    """Three layers of three attempts make 27 downstream calls; a budget of 2 makes 3."""

    def call_layers(
        engine: Engine | None, sid: int, node: int, depth: int, calls: list[int]
    ) -> bool:
        for attempt in range(3):
            if attempt > 0 and engine is not None:  # the first attempt is free
                if isinstance(engine.consume(sid, node, "retry", 1), Denial):
                    return False
            if depth == 0:
                calls.append(1)  # the downstream call, which fails
                ok = False
            else:
                ok = call_layers(engine, sid, node, depth - 1, calls)
            if ok:
                return True
        return False

    without: list[int] = []
    call_layers(None, 0, 0, 2, without)
    assert len(without) == 27
    w = World()
    task = w.node(quotas={"retry": 2})
    with_budget: list[int] = []
    call_layers(w.engine, w.session(), task, 2, with_budget)
    assert len(with_budget) == 3


# ---- the tree -------------------------------------------------------------------------------


def test_children_inherit_nested_defaults() -> None:
    w = World()
    grand = Defaults(quotas=(("http", 5),))
    t = w.node(
        defaults=Defaults(quotas=(("http", 50),), limits=(("db", 2),), weight=3, children=grand)
    )
    child = w.node(t)
    n = w.engine.state.nodes[child]
    assert (n.quotas, n.limits, n.weight) == ({"http": 50}, {"db": 2}, 3)
    grandchild = w.node(child, quotas={"retry": 1})
    assert w.engine.state.nodes[grandchild].quotas == {"http": 5, "retry": 1}


def test_deadline_ends_the_topmost_node_past_it_and_cancels_its_descendants() -> None:
    w = World()
    t = w.node(deadline_ms=5_000)
    child = w.node(t, deadline_ms=9_000)  # effective deadline is the parent's 5,000
    assert w.engine.effective_deadline_ms(child) == 5_000
    sid = w.session()
    lease = w.engine.acquire(sid, child, "db")
    assert isinstance(lease, Granted)
    w.clock.advance(4_000)  # now 5,000
    w.engine.tick()
    nodes = w.engine.state.nodes
    assert nodes[t].state is NodeState.DEADLINE_EXCEEDED
    assert nodes[child].state is NodeState.CANCELLED
    assert w.engine.validate(lease.lease_id).end is LeaseEnd.NODE_ENDED
    assert w.engine.consume(sid, child, "http", 1) == Denial(DenyReason.NODE_ENDED, child)


def test_terminal_states_are_final_and_ended_nodes_are_purged_keeping_usage() -> None:
    w = World(EngineConfig(retention_ms=1_000))
    t = w.node()
    task = w.node(t)
    sid = w.session()
    w.engine.consume(sid, task, "http", 7)
    w.engine.end_node(None, task, NodeState.DONE)
    w.engine.end_node(None, task, NodeState.CANCELLED)  # no-op: terminal is final
    assert w.engine.state.nodes[task].state is NodeState.DONE
    w.clock.advance(1_000)
    w.engine.tick()
    assert task not in w.engine.state.nodes
    assert w.engine.state.nodes[t].used["http"] == 7
    assert w.engine.state.nodes[t].absorbed["http"] == 7


# ---- sessions, leases, fencing ---------------------------------------------------------------


def test_session_expiry_ends_leases_lazily_and_leaves_tombstones() -> None:
    w = World()
    t = w.node(limits={"db": 1})
    dead = w.session(ttl_ms=1_000)
    other = w.session(ttl_ms=60_000)
    lease = w.engine.acquire(dead, t, "db")
    assert isinstance(lease, Granted)
    queued = w.engine.acquire(other, t, "db")
    assert isinstance(queued, Queued)
    w.clock.advance(1_000)
    # no reaper ran: the next touch of anything expires the session and hands the slot on
    status = w.engine.validate(lease.lease_id)
    assert status.end is LeaseEnd.SESSION_EXPIRED
    assert isinstance(w.engine.take_outcome(other, queued.waiter_id), Granted)
    assert w.engine.release(dead, lease.lease_id) == Released(
        lease.lease_id, LeaseEnd.SESSION_EXPIRED, False
    )
    with pytest.raises(SessionEnded):
        w.engine.consume(dead, t, "http", 1)
    w.clock.advance(60_000)
    w.engine.tick()
    with pytest.raises(NotFound):
        w.engine.validate(lease.lease_id)


def test_release_twice_is_a_no_op_and_another_session_is_not_the_owner() -> None:
    w = World()
    t = w.node()
    a, b = w.session(), w.session()
    lease = w.engine.acquire(a, t, "db")
    assert isinstance(lease, Granted)
    with pytest.raises(NotOwner):
        w.engine.release(b, lease.lease_id)
    assert w.engine.release(a, lease.lease_id) == Released(lease.lease_id, LeaseEnd.RELEASED, True)
    assert w.engine.release(a, lease.lease_id) == Released(lease.lease_id, LeaseEnd.RELEASED, False)


def test_session_and_lease_ids_share_one_counter_that_only_grows() -> None:
    w = World()
    t = w.node()
    ids = []
    for _ in range(5):
        sid = w.session()
        lease = w.engine.acquire(sid, t, "db")
        assert isinstance(lease, Granted)
        ids += [sid, lease.lease_id]
        w.engine.close_session(sid)
    assert ids == sorted(set(ids))
    restored = w.restored()
    sid2, _ = restored.open_session(ROOT_ID, 1000, "f" * 64)
    assert sid2 > ids[-1]


def test_restart_gives_open_sessions_one_fresh_ttl() -> None:
    w = World()
    sid = w.session(ttl_ms=5_000)
    w.clock.advance(4_000)
    restored = w.restored()
    assert restored.state.sessions[sid].expires_ms == w.clock.now_ms() + 5_000


# ---- the fair queue ---------------------------------------------------------------------------


def _pool(
    w: World, weights: dict[str, int], limit: int = 1
) -> tuple[dict[str, int], dict[str, int]]:
    w.engine.set_limit(None, ROOT_ID, "db", limit)
    tenants = {name: w.node(name=name, weight=wt) for name, wt in weights.items()}
    sessions = {name: w.session(t) for name, t in tenants.items()}
    return tenants, sessions


def _drain(w: World, holder: int, lease_id: int, n: int, owners: dict[int, str]) -> list[str]:
    """Release the one slot ``n`` times, recording which tenant each queued grant went to."""
    order = []
    for _ in range(n):
        w.engine.release(holder, lease_id)
        grant = next(e for e in reversed(w.events) if isinstance(e, gov._events.LeaseGranted))
        order.append(owners[grant.waiter_id])  # type: ignore[index]
        holder, lease_id = grant.session_id, grant.lease_id
    return order


def test_tenants_alternate_by_weight_whatever_their_queue_lengths() -> None:
    w = World()
    tenants, sessions = _pool(w, {"big": 1, "small": 1, "heavy": 2})
    first = w.engine.acquire(sessions["big"], tenants["big"], "db")
    assert isinstance(first, Granted)
    owners: dict[int, str] = {}
    for name, count in (("big", 200), ("small", 3), ("heavy", 200)):
        for _ in range(count):
            q = w.engine.acquire(sessions[name], tenants[name], "db")
            assert isinstance(q, Queued)
            owners[q.waiter_id] = name
    order = _drain(w, sessions["big"], first.lease_id, 12, owners)
    assert order[:8] == [
        "big",
        "small",
        "heavy",
        "heavy",
        "big",
        "small",
        "heavy",
        "heavy",
    ]
    assert order[8:] == ["big", "small", "heavy", "heavy"]


def test_dispatch_is_work_conserving_and_skips_a_tenant_whose_cap_is_full() -> None:
    w = World()
    w.engine.set_limit(None, ROOT_ID, "db", 3)
    t = w.node(name="t", limits={"db": 2})
    full_task = w.node(t, limits={"db": 1})
    free_task = w.node(t)
    other = w.node(name="other")
    s, s2 = w.session(t), w.session(other)
    held = [w.engine.acquire(s, full_task, "db"), w.engine.acquire(s, free_task, "db")]
    assert all(isinstance(h, Granted) for h in held)
    blocked = w.engine.acquire(s, full_task, "db")  # its own task is full
    later = w.engine.acquire(s, free_task, "db")  # tenant cap 2 is full too
    assert isinstance(blocked, Queued) and isinstance(later, Queued)
    assert isinstance(
        w.engine.acquire(s2, other, "db"), Granted
    )  # root has room: no queue jump needed
    w.engine.release(s, held[1].lease_id)  # type: ignore[union-attr]
    # the head waiter still does not fit (its task is full); the one behind it does
    assert w.engine.take_outcome(s, blocked.waiter_id) is None
    assert isinstance(w.engine.take_outcome(s, later.waiter_id), Granted)


def test_strict_priority_inside_a_tenant() -> None:
    w = World()
    w.engine.set_limit(None, ROOT_ID, "db", 1)
    t = w.node(name="t")
    low, high = w.node(t, priority=0), w.node(t, priority=5)
    s = w.session(t)
    first = w.engine.acquire(s, low, "db")
    q_low = w.engine.acquire(s, low, "db")
    q_high = w.engine.acquire(s, high, "db")
    assert isinstance(first, Granted) and isinstance(q_low, Queued) and isinstance(q_high, Queued)
    w.engine.release(s, first.lease_id)
    assert isinstance(w.engine.take_outcome(s, q_high.waiter_id), Granted)
    assert w.engine.take_outcome(s, q_low.waiter_id) is None


def test_a_wait_cancelled_as_it_is_granted_releases_the_lease_to_the_next_waiter() -> None:
    w = World()
    w.engine.set_limit(None, ROOT_ID, "db", 1)
    t = w.node()
    s = w.session()
    first = w.engine.acquire(s, t, "db")
    racer = w.engine.acquire(s, t, "db")
    nxt = w.engine.acquire(s, t, "db")
    assert isinstance(first, Granted) and isinstance(racer, Queued) and isinstance(nxt, Queued)
    w.engine.release(s, first.lease_id)  # the grant goes to the racer ...
    released = w.engine.cancel_wait(s, racer.waiter_id)  # ... whose caller gave up at that instant
    assert released is not None and released.by_this_call
    assert isinstance(w.engine.take_outcome(s, nxt.waiter_id), Granted)
    assert len(w.engine.state.leases) == 1


# ---- adaptive limits ---------------------------------------------------------------------------


def test_aimd_multiplies_by_0_7_on_slow_p95_adds_one_otherwise_and_needs_samples() -> None:
    w = World()
    cfg = AdaptiveConfig(
        initial_limit=10,
        min_limit=2,
        max_limit=11,
        target_p95_ms=100,
        min_samples=4,
        interval_ms=1_000,
    )
    w.engine.set_adaptive("db", cfg)
    t = w.node()
    s = w.session(ttl_ms=10**9)

    def round_of(latency: int, n: int = 4) -> int:
        for _ in range(n):
            lease = w.engine.acquire(s, t, "db")
            assert isinstance(lease, Granted)
            w.engine.release(s, lease.lease_id, latency_ms=latency)
        w.clock.advance(1_000)
        w.engine.tick()
        return w.engine.state.nodes[ROOT_ID].limits["db"]

    assert round_of(10) == 11
    assert round_of(10) == 11  # not above max
    assert round_of(500) == 7  # 11 * 0.7
    assert round_of(500, n=2) == 7  # too few samples: no move
    assert round_of(500, n=2) == 4  # now 4 samples
    assert round_of(500) == 2  # not below min


def test_lowering_a_limit_revokes_no_lease() -> None:
    w = World()
    t = w.node(limits={"db": 3})
    s = w.session()
    leases = [w.engine.acquire(s, t, "db") for _ in range(3)]
    w.engine.set_limit(None, t, "db", 1)
    assert len(w.engine.state.leases) == 3
    assert isinstance(w.engine.acquire(s, t, "db", wait=False), Denial)
    for lease in leases[:2]:
        w.engine.release(s, lease.lease_id)  # type: ignore[union-attr]
    assert isinstance(w.engine.acquire(s, t, "db", wait=False), Denial)
    w.engine.release(s, leases[2].lease_id)  # type: ignore[union-attr]
    assert isinstance(w.engine.acquire(s, t, "db", wait=False), Granted)


# ---- idempotency, scope, caller errors -----------------------------------------------------------


def test_a_retried_request_id_returns_the_first_result_even_after_a_restart() -> None:
    w = World()
    t = w.node(quotas={"http": 10})
    s = w.session()
    first = w.engine.consume(s, t, "http", 4, request_id="abc")
    n = len(w.events)
    assert w.engine.consume(s, t, "http", 4, request_id="abc") == first
    assert len(w.events) == n
    with pytest.raises(RequestIdReused) as info:
        w.engine.consume(s, t, "http", 5, request_id="abc")
    assert info.value.field == "request_id"
    restored = w.restored()
    assert restored.consume(s, t, "http", 4, request_id="abc") == first
    assert restored.state.nodes[t].used["http"] == 4


def test_request_memory_holds_the_last_1024_ids_per_session() -> None:
    w = World()
    t = w.node()
    s = w.session()
    for i in range(1025):
        w.engine.consume(s, t, "http", 1, request_id=f"r{i}")
    memory = w.engine.state.sessions[s].memory
    assert len(memory) == 1024 and "r0" not in memory and "r1024" in memory


def test_scope_allows_the_subtree_but_not_the_scope_node_or_outside() -> None:
    w = World()
    a, b = w.node(name="a"), w.node(name="b")
    task = w.node(a)
    s = w.session(a)
    w.engine.set_quota(s, task, "http", 5)  # inside: allowed
    before = canonical(w.engine)
    for call in (
        lambda: w.engine.set_quota(s, a, "http", 10**9),  # its own cap: no
        lambda: w.engine.consume(s, b, "http", 1),
        lambda: w.engine.acquire(s, b, "db"),
        lambda: w.engine.create_node(s, b, "x"),
    ):
        with pytest.raises(OutOfScope):
            call()
    assert canonical(w.engine) == before


@pytest.mark.parametrize(
    "call,field",
    [
        (lambda e, s, t: e.consume(s, t, "http", 0), "amount"),
        (lambda e, s, t: e.consume(s, t, "", 1), "resource"),
        (lambda e, s, t: e.consume(s, t, "http", True), "amount"),
        (lambda e, s, t: e.create_node(s, t, "x", quotas={"http": -1}), "quotas[http]"),
        (lambda e, s, t: e.set_weight(s, t, 0), "weight"),
        (lambda e, s, t: e.open_session(t, 0, "a" * 64), "ttl_ms"),
        (lambda e, s, t: e.consume(s, 999, "http", 1), "node_id"),
    ],
)
def test_caller_errors_name_the_field_and_change_nothing(call: Any, field: str) -> None:
    w = World()
    t = w.node()
    task = w.node(t)
    s = w.session(t)
    before, n = canonical(w.engine), len(w.events)
    with pytest.raises((InvalidArgument, NotFound)) as info:
        call(w.engine, s, task)
    assert isinstance(info.value, ValueError) and info.value.field == field
    assert canonical(w.engine) == before and len(w.events) == n


# ---- events and the public API -----------------------------------------------------------------


def test_events_round_trip_and_unknown_kinds_refuse() -> None:
    w = World()
    t = w.node(defaults=Defaults(quotas=(("http", 1),), children=Defaults(weight=2)))
    s = w.session()
    w.engine.acquire(s, t, "db")
    for event in w.events:
        kind, data = encode_event(event)
        assert decode_event(kind, data) == event
    with pytest.raises(UnknownEventKind):
        decode_event("Teleported", {})
    with pytest.raises(UnknownEventKind):
        decode_event("Charged", {"seq": "one"})


# the public names, as prose: a change to the package's __all__ must be a change here too
PUBLIC_API = """
    EVENT_KINDS NODE_TRANSITIONS POLICY_HISTORY_MAX POLICY_KEYS_MAX ROOT_ID
    SESSION_TRANSITIONS SNAPSHOT_FORMAT AccessError AdaptiveConfig BlockEnd CallerError
    Clock Consumed Created CreditGrant CreditReturn decode_event decode_value Defaults
    Denial DenyReason Edited encode_event encode_value Engine EngineConfig Event EventSink
    GenerationConflict GovernorError Granted InvalidArgument LeaseEnd LeaseStatus LogGap
    ManualClock NodeState NotFound NotOwner OutOfScope PolicyBook PolicyPutResult
    PolicyRecord Queued Rate RecordError Released RequestIdReused RequestTag SessionEnded
    SessionState SnapshotMismatch State UnknownEventKind Waiter
""".split()


def test_public_api_is_pinned() -> None:
    assert sorted(gov.__all__) == sorted(PUBLIC_API)
    for name in gov.__all__:
        assert hasattr(gov, name), name


def test_restore_refuses_gaps_and_events_that_do_not_apply() -> None:
    from governor.engine import LogGap, RecordError
    from governor.engine import _events as ev

    def restore(events: list[Event]) -> Engine:
        return Engine.restore(None, events, ManualClock(0), lambda e: None)

    with pytest.raises(RecordError, match="does not apply"):
        restore([ev.Charged(1, 0, 999, "http", 1, None, None)])
    with pytest.raises(LogGap):
        restore([ev.SessionOpened(2, 0, 1, ROOT_ID, 10, "a" * 64)])


def test_sessions_are_found_by_token_hash_while_open_and_after_a_restart() -> None:
    w = World()
    token = hashlib.sha256(b"secret").hexdigest()
    sid, _ = w.engine.open_session(ROOT_ID, 1_000, token)
    assert w.engine.session_for_token(token) == sid
    assert w.restored().session_for_token(token) == sid
    snap_restored = Engine.restore(w.engine.snapshot(), [], ManualClock(0), lambda e: None)
    assert snap_restored.session_for_token(token) == sid
    w.engine.close_session(sid)
    assert w.engine.session_for_token(token) is None


def _node_in(w: World, state: NodeState) -> int:
    """A node brought into ``state`` the way the engine gets there."""
    node = w.node(deadline_ms=2_000 if state is NodeState.DEADLINE_EXCEEDED else None)
    if state in (NodeState.DONE, NodeState.CANCELLED):
        w.engine.end_node(None, node, state)
    elif state is NodeState.DEADLINE_EXCEEDED:
        w.clock.advance(1_000)
        w.engine.tick()
    assert w.engine.state.nodes[node].state is state
    return node


@pytest.mark.parametrize("start", list(NodeState))
@pytest.mark.parametrize("target", list(NodeState))
def test_every_node_state_and_input_pair_follows_the_transition_table(
    start: NodeState, target: NodeState
) -> None:
    from governor.engine import NODE_TRANSITIONS

    w = World()
    node = _node_in(w, start)
    sid = w.session()
    if target in (NodeState.DONE, NodeState.CANCELLED):
        w.engine.end_node(None, node, target)
    elif target is NodeState.DEADLINE_EXCEEDED:
        w.engine.set_deadline(None, node, w.clock.now_ms())
    else:
        assert w.engine.consume(sid, node, "http", 1)  # an ordinary input
    now = w.engine.state.nodes[node].state
    expected = target if target in NODE_TRANSITIONS[start] else start
    assert now is expected
    if now.terminal:  # no consume or grant on an ended node
        assert w.engine.consume(sid, node, "http", 1) == Denial(DenyReason.NODE_ENDED, node)
        assert w.engine.acquire(sid, node, "db") == Denial(DenyReason.NODE_ENDED, node)


ENGINE_CALLS = """
    acquire activity cancel_wait close_session config consume create_node credit_level
    effective_deadline_ms end_node heartbeat last_seq open_session put_policy queued release
    remove_policy reserve_credit restore return_credit session_for_key session_for_token
    set_adaptive set_cooldown set_deadline set_defaults set_limit set_quota set_rate set_weight
    snapshot state take_outcome tick validate
""".split()


def test_the_engine_facade_keeps_its_calls() -> None:
    """The engine is composed of books; its callers see one object with these names."""
    engine = gov.Engine(gov.ManualClock(0), lambda e: None)
    assert sorted(n for n in dir(engine) if not n.startswith("_")) == ENGINE_CALLS

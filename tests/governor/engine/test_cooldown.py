"""Named cooldowns on a node (gov's fleet-wide back-off): they only grow unless replaced,
are bounded per node, refuse bad input without an event, and survive replay and snapshot."""

from __future__ import annotations

import json

import pytest

from governor.engine import Engine, InvalidArgument, ManualClock, decode_event, encode_event
from governor.engine._engine import COOLDOWNS_PER_NODE_MAX
from governor.testing.checks import canonical
from tests.governor.engine.test_engine import World


def test_cooldowns_grow_are_replaced_and_expire() -> None:
    w = World()
    node = w.node(name="gov")
    sid = w.session()
    now = w.clock.now_ms()
    w.engine.set_cooldown(sid, node, "model", 90_000)
    assert w.engine.state.nodes[node].cooldowns == {"model": now + 90_000}
    w.engine.set_cooldown(sid, node, "model", 5_000)  # shorter: the longer end stays
    assert w.engine.state.nodes[node].cooldowns == {"model": now + 90_000}
    w.engine.set_cooldown(sid, node, "model", 5_000, replace=True)
    assert w.engine.state.nodes[node].cooldowns == {"model": now + 5_000}
    w.engine.set_cooldown(sid, node, "model", 0, replace=True)  # cleared
    assert w.engine.state.nodes[node].cooldowns == {}
    w.engine.set_cooldown(sid, node, "a", 1_000)
    w.clock.advance(2_000)
    w.engine.set_cooldown(sid, node, "b", 1_000)  # the expired one is dropped on the way
    assert set(w.engine.state.nodes[node].cooldowns) == {"b"}


def test_bad_input_and_the_bound_emit_nothing() -> None:
    w = World()
    node = w.node(name="gov")
    sid = w.session()
    for i in range(COOLDOWNS_PER_NODE_MAX):
        w.engine.set_cooldown(sid, node, f"c{i}", 60_000)
    seen = len(w.events)
    for name, ms in (("c-new", 60_000), ("", 1_000), ("ok", -1), ("ok", 10**12)):
        with pytest.raises(InvalidArgument):
            w.engine.set_cooldown(sid, node, name, ms)
    assert len(w.events) == seen
    w.engine.set_cooldown(sid, node, "c0", 70_000)  # an existing name may still grow


def test_cooldowns_survive_replay_and_snapshot() -> None:
    w = World()
    node = w.node(name="gov")
    sid = w.session()
    w.engine.set_cooldown(sid, node, "model", 90_000, request_id="r1")
    w.engine.set_cooldown(sid, node, "model", 90_000, request_id="r1")  # a retry: no event
    assert sum(type(e).__name__ == "CooldownSet" for e in w.events) == 1
    for event in w.events:
        kind, data = encode_event(event)
        assert decode_event(kind, json.loads(json.dumps(data))) == event
    snap = json.loads(json.dumps(w.engine.snapshot()))
    clock = ManualClock(w.clock.now_ms())
    by_events = Engine.restore(None, w.events, clock, lambda e: None)
    by_snapshot = Engine.restore(snap, [], clock, lambda e: None)
    assert canonical(by_events)["nodes"] == canonical(w.engine)["nodes"]
    assert by_snapshot.state.nodes[node].cooldowns == w.engine.state.nodes[node].cooldowns

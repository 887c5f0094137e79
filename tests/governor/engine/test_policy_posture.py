"""A policy's posture at governord: a shadow put is stored as shadow in the event and the
snapshot, survives replay, and a record from before postures reads as enforcing."""

from __future__ import annotations

import json

import pytest

from governor.engine import (
    Engine,
    Event,
    GenerationConflict,
    ManualClock,
    decode_event,
    encode_event,
)
from governor.engine._events import PolicyPut
from ratemesh.policy import Posture, TenantRatePolicy


def _engine() -> tuple[Engine, list[Event], ManualClock]:
    clock = ManualClock(1_000)
    events: list[Event] = []
    return Engine(clock, events.append), events, clock


def test_a_shadow_put_survives_the_codec_replay_and_snapshot() -> None:
    engine, events, clock = _engine()
    shadow = TenantRatePolicy("acme", "read_iops", 1, 100, 10, 5, posture=Posture.SHADOW)
    stored = engine.put_policy(shadow, allocate=True).policy
    assert stored.shadow
    rate_min = TenantRatePolicy.from_dict(
        {
            "tenant_id": "beta",
            "metric": "requests",
            "generation": 1,
            "target_rate": "600/minute",
            "global_burst": 10,
            "local_burst_cap": 5,
            "mode": "share",
            "posture": "shadow",
        }
    )
    engine.put_policy(rate_min, allocate=True)
    kind, payload = encode_event(events[0])
    assert payload["posture"] == "shadow"
    stored_events = [
        decode_event(k, json.loads(json.dumps(p))) for k, p in map(encode_event, events)
    ]
    assert stored_events == events
    snap = json.loads(json.dumps(engine.snapshot()))
    for restored in (
        Engine.restore(None, stored_events, clock, lambda e: None),
        Engine.restore(snap, [], clock, lambda e: None),
        Engine.restore(
            json.loads(
                json.dumps(
                    Engine.restore(None, stored_events[:1], clock, lambda e: None).snapshot()
                )
            ),
            stored_events[1:],
            clock,
            lambda e: None,
        ),
    ):
        got = {p.tenant_id: p for p in restored.state.policies.current()}
        assert got["acme"] == stored and got["acme"].shadow
        assert (
            got["beta"] == rate_min and got["beta"].shadow and got["beta"].scale == rate_min.scale
        )
    # the same values enforcing are a change: a new generation
    enforced = engine.put_policy(
        TenantRatePolicy("acme", "read_iops", 1, 100, 10, 5), allocate=True
    ).policy
    assert enforced.generation == 2 and not enforced.shadow
    # generation 1 pushed again as shadow is the stored one (a no-op); as enforcing, a conflict
    assert not engine.put_policy(shadow, allocate=False).created
    with pytest.raises(GenerationConflict, match="generation 1 is already other values"):
        engine.put_policy(TenantRatePolicy("acme", "read_iops", 1, 100, 10, 5), allocate=False)


def test_an_enforcing_record_leaves_posture_out_and_an_old_record_replays_enforcing() -> None:
    engine, events, clock = _engine()
    engine.put_policy(TenantRatePolicy("acme", "read_iops", 1, 100, 10, 5), allocate=True)
    kind, payload = encode_event(events[0])
    assert "posture" not in payload  # a release before postures reads it
    old = decode_event(kind, payload)
    assert isinstance(old, PolicyPut) and old.posture is None
    restored = Engine.restore(None, [old], clock, lambda e: None)
    (p,) = restored.state.policies.current()
    assert p.posture is Posture.ENFORCE and not p.shadow
    # a snapshot record of before postures: five values, no trailing mapping
    snap = json.loads(json.dumps(engine.snapshot()))
    (record,) = snap["policies"]["keys"][0][2]
    assert len(record[2]) == 5
    (q,) = Engine.restore(snap, [], clock, lambda e: None).state.policies.current()
    assert q == p

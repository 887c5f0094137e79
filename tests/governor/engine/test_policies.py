"""governord as the mesh's policy coordinator, in the engine: generations are allocated from
the durable state, only grow per key (across snapshot + replay too), never mean two things,
and a refused put changes nothing."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest

from governor.engine import (
    POLICY_HISTORY_MAX,
    Engine,
    Event,
    GenerationConflict,
    InvalidArgument,
    ManualClock,
    NotFound,
    RecordError,
    decode_event,
    encode_event,
)
from governor.engine import _policybook as book_mod
from governor.engine._events import PolicyPut
from ratemesh.checks import INT_MAX
from ratemesh.policy import Metric, Mode, TenantRatePolicy, Unit

READ = Metric.READ_IOPS


def policy(tenant: str = "acme", gen: int = 1, rate: int = 100, **kw: Any) -> TenantRatePolicy:
    return TenantRatePolicy(tenant, kw.pop("metric", READ), gen, rate, 10, 5, **kw)


class World:
    def __init__(self) -> None:
        self.clock = ManualClock(1_000)
        self.events: list[Event] = []
        self.engine = Engine(self.clock, self.events.append)

    def put(self, p: TenantRatePolicy, **kw: Any) -> TenantRatePolicy:
        kw.setdefault("allocate", True)
        return self.engine.put_policy(p, **kw).policy

    def restored(self, *, snapshot_at: int | None = None) -> Engine:
        """Replay through the store's encoding; with `snapshot_at`, a snapshot taken after
        that many events, then the rest."""
        stored = [decode_event(*encode_event(e)) for e in self.events]
        clock = ManualClock(self.clock.now_ms())
        if snapshot_at is None:
            return Engine.restore(None, stored, clock, lambda e: None)
        head = Engine.restore(None, stored[:snapshot_at], clock, lambda e: None)
        return Engine.restore(head.snapshot(), stored[snapshot_at:], clock, lambda e: None)


def test_allocation_is_last_plus_one_and_unchanged_values_are_no_change() -> None:
    w = World()
    assert w.put(policy(gen=7)).generation == 1  # allocate ignores the number given
    assert w.put(policy(rate=200)).generation == 2
    again = w.engine.put_policy(policy(rate=200), allocate=True)
    assert not again.created and again.policy.generation == 2
    assert w.put(policy(rate=100)).generation == 3  # a rollback is a new generation
    assert w.put(policy(metric=Metric.WRITE_IOPS)).generation == 1  # per (tenant, metric)
    assert w.engine.state.policies.revision == 4 and len(w.events) == 4


def test_an_explicit_generation_must_be_above_the_last_or_the_same_policy() -> None:
    w = World()
    w.put(policy(gen=3), allocate=False)  # a node's file numbering is adopted
    assert w.engine.state.policies.last_generation("acme", READ) == 3
    same = w.engine.put_policy(policy(gen=3), allocate=False)
    assert not same.created
    n = len(w.events)
    with pytest.raises(GenerationConflict, match="already other values"):
        w.engine.put_policy(policy(gen=3, rate=5), allocate=False)
    with pytest.raises(GenerationConflict, match="not above the last, 3"):
        w.engine.put_policy(policy(gen=2, rate=5), allocate=False)
    assert len(w.events) == n and w.engine.state.policies.revision == 1


def test_expect_generation_refuses_a_change_computed_against_an_older_one() -> None:
    w = World()
    w.put(policy())
    w.put(policy(rate=300))  # another writer
    with pytest.raises(GenerationConflict, match="at generation 2, not 1"):
        w.put(policy(rate=400), expect_generation=1)
    assert w.put(policy(rate=400), expect_generation=2).generation == 3
    assert w.put(policy("new"), expect_generation=0).generation == 1


def test_removal_is_a_tombstone_generation_and_numbering_continues() -> None:
    w = World()
    w.put(policy())
    assert w.engine.remove_policy("acme", READ) == 2
    assert w.engine.state.policies.current() == []
    assert w.engine.state.policies.tombstones() == [("acme", READ, 2)]
    with pytest.raises(NotFound):
        w.engine.remove_policy("acme", READ)
    with pytest.raises(GenerationConflict, match="already a removal"):
        w.engine.put_policy(policy(gen=2), allocate=False)
    assert w.put(policy()).generation == 3  # the same values as gen 1: still a new one


def test_history_is_bounded_but_the_last_generation_is_never_forgotten() -> None:
    w = World()
    for i in range(POLICY_HISTORY_MAX + 5):
        w.put(policy(rate=100 + i))
    key = w.engine.state.policies.keys[("acme", READ)]
    assert len(key.history) == POLICY_HISTORY_MAX
    assert key.history[0].generation == 6 and key.last.generation == POLICY_HISTORY_MAX + 5
    # a trimmed generation cannot be re-given: it is below the last
    with pytest.raises(GenerationConflict):
        w.engine.put_policy(policy(gen=1), allocate=False)


def test_the_key_bound_refuses_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import governor.engine._policies as calls

    monkeypatch.setattr(calls, "POLICY_KEYS_MAX", 2)
    monkeypatch.setattr(book_mod, "POLICY_KEYS_MAX", 2)
    w = World()
    w.put(policy("a"))
    w.put(policy("b"))
    with pytest.raises(InvalidArgument, match="POLICY_KEYS_MAX"):
        w.put(policy("c"))
    assert w.put(policy("a", rate=9)).generation == 2  # existing keys still change
    assert len(w.engine.state.policies.keys) == 2


def test_bad_input_is_refused_and_changes_nothing() -> None:
    w = World()
    w.put(policy())
    before = w.engine.state.policies.dump()
    with pytest.raises(InvalidArgument):
        w.engine.put_policy({"tenant_id": "acme"}, allocate=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        w.put(policy(rate=5), expect_generation=-1)
    with pytest.raises(InvalidArgument):
        w.engine.remove_policy("acme", "Read IOPS")
    assert w.engine.state.policies.dump() == before and len(w.events) == 1


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_generations_are_monotonic_across_snapshot_and_replay(seed: int) -> None:
    """Random puts, removals and refusals; after each restart (replay, or snapshot + replay at
    a random point) the next allocation continues from the last, and state equals live."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    w = World()
    tenants = ["a", "b", "*"]
    metrics = [READ, Metric.CLIENT_EGRESS_BYTES]
    for _ in range(200):
        t, m = rng.choice(tenants), rng.choice(metrics)
        w.clock.advance(rng.randint(0, 50))
        roll = rng.random()
        try:
            if roll < 0.6:
                # redis meters requests only (a refunded unit would be lost in its script)
                modes = [x for x in Mode if x is not Mode.REDIS or m is READ]
                w.put(policy(t, rate=rng.randint(1, 5), metric=m, mode=rng.choice(modes)))
            elif roll < 0.8:
                last = w.engine.state.policies.last_generation(t, m)
                gen = max(1, last + rng.randint(-2, 3))
                w.put(policy(t, gen, rate=rng.randint(1, 5), metric=m), allocate=False)
            else:
                w.engine.remove_policy(t, m)
        except (GenerationConflict, NotFound):
            pass
    live = w.engine.state.policies
    for at in (None, rng.randint(0, len(w.events)), len(w.events)):
        back = w.restored(snapshot_at=at).state.policies
        assert back.dump() == live.dump(), f"seed={seed} snapshot_at={at}"
        assert back.current() == live.current()
    engine = w.restored(snapshot_at=rng.randint(0, len(w.events)))
    for t in tenants:
        for m in metrics:
            last = live.last_generation(t, m)
            got = engine.put_policy(policy(t, rate=999, metric=m), allocate=True).policy
            assert got.generation == last + 1, f"seed={seed}"


def test_policy_events_round_trip_through_the_codec() -> None:
    w = World()
    w.put(policy(mode=Mode.STRICT, enabled=False))
    w.engine.remove_policy("acme", READ)
    for e in w.events:
        kind, payload = encode_event(e)
        assert decode_event(kind, payload) == e
    kind, payload = encode_event(w.events[0])
    with pytest.raises(Exception, match="does not decode"):
        decode_event(kind, {**payload, "metric": "Read_Ops"})
    put = w.events[0]
    assert isinstance(put, PolicyPut)
    bad = replace(put, target_rate=0)  # a record governord never wrote
    with pytest.raises(RecordError, match="target_rate"):
        Engine.restore(None, [bad], ManualClock(0), lambda e: None)


def test_the_last_generation_number_is_refused_cleanly() -> None:
    w = World()
    w.put(policy(gen=INT_MAX), allocate=False)
    with pytest.raises(InvalidArgument, match="every generation"):
        w.put(policy(rate=1))
    with pytest.raises(InvalidArgument, match="no generation left"):
        w.engine.remove_policy("acme", READ)
    assert len(w.events) == 1


# -- an open vocabulary ------------------------------------------------------------


def test_unit_string_rate_and_descriptor_are_stored_and_survive_replay() -> None:
    w = World()
    tok = TenantRatePolicy.from_dict(
        {
            "tenant_id": "acme",
            "metric": "tokens",
            "generation": 1,
            "target_rate": "60k/minute",
            "global_burst": "8k",
            "local_burst_cap": "1k",
            "unit": "tokens",
            "descriptor": {"route": "/v1/chat"},
        }
    )
    stored = w.put(tok)
    assert stored == tok and stored.target_rate == 1000 and stored.unit is Unit.TOKENS
    w.put(policy(metric="requests"))
    for engine in (w.restored(), w.restored(snapshot_at=1)):
        got = {(p.tenant_id, p.metric): p for p in engine.state.policies.current()}
        assert got[(tok.tenant_id, "tokens")] == tok
        assert got[("acme", "requests")].unit is Unit.REQUESTS
    assert w.engine.remove_policy(tok.tenant_id, "tokens") == 2  # the descriptor's own key


def test_a_metric_has_one_unit_at_governord() -> None:
    w = World()
    w.put(policy(metric="llm", unit=Unit.TOKENS))
    before = w.engine.state.policies.dump()
    with pytest.raises(InvalidArgument) as info:
        w.put(policy("beta", metric="llm", unit=Unit.USD_MICROS))
    assert info.value.field == "unit"
    assert "counted in tokens by acme/llm generation 1; beta/llm says usd_micros" in str(info.value)
    assert w.engine.state.policies.dump() == before
    assert w.put(policy("acme", metric="llm", unit=Unit.USD_MICROS)).generation == 2  # own key


def test_an_event_logged_before_units_decodes_with_the_names_unit() -> None:
    w = World()
    w.put(policy(metric=Metric.CLIENT_EGRESS_BYTES))
    kind, payload = encode_event(w.events[0])
    old = {k: v for k, v in payload.items() if k != "unit"}  # a record from an older release
    e = decode_event(kind, old)
    assert isinstance(e, PolicyPut) and e.unit is None
    engine = Engine.restore(None, [e], ManualClock(w.clock.now_ms()), lambda e: None)
    (p,) = engine.state.policies.current()
    assert p.unit is Unit.BYTES and p == w.engine.state.policies.current()[0]


def test_a_rate_per_minute_is_stored_in_sub_units_and_survives_replay() -> None:
    """A rate of "5000/minute" is kept as scale 3 sub-units per unit; the event and the
    snapshot carry the scale, and replay gives back the same policy and its text form."""
    w = World()
    p = TenantRatePolicy.from_dict(
        {
            "tenant_id": "acme",
            "metric": "requests",
            "generation": 1,
            "target_rate": "5000/minute",
            "global_burst": 10,
            "local_burst_cap": 5,
        }
    )
    stored = w.put(p)
    assert stored == p and (stored.scale, stored.target_rate, stored.global_burst) == (3, 250, 30)
    put = w.events[-1]
    assert isinstance(put, PolicyPut) and put.scale == 3 and put.target_rate == 250
    w.put(policy(metric="other_requests"))
    assert w.events[-1].scale is None  # type: ignore[union-attr]  # a whole rate: as before
    for engine in (w.restored(), w.restored(snapshot_at=1), w.restored(snapshot_at=2)):
        got = {(q.tenant_id, q.metric): q for q in engine.state.policies.current()}
        assert got[("acme", "requests")] == p
        assert got[("acme", "requests")].to_dict()["target_rate"] == "5000/minute"
        assert got[("acme", "other_requests")].scale == 1
    assert w.put(p).generation == 1  # unchanged values: no new generation


def test_an_event_logged_before_scales_decodes_as_scale_1() -> None:
    w = World()
    w.put(policy())
    kind, payload = encode_event(w.events[0])
    assert payload["scale"] is None
    old = {k: v for k, v in payload.items() if k != "scale"}  # a record from before
    e = decode_event(kind, old)
    assert isinstance(e, PolicyPut) and e.scale is None
    engine = Engine.restore(None, [e], ManualClock(w.clock.now_ms()), lambda e: None)
    (p,) = engine.state.policies.current()
    assert p.scale == 1 and p == w.engine.state.policies.current()[0]


def test_a_quota_policy_is_stored_and_survives_replay_and_snapshot() -> None:
    """A spend quota's period and cap are in the PolicyPut event and the snapshot, so a
    coordinator can push quotas like any other policy."""
    w = World()
    q = TenantRatePolicy("acme", "spend", 1, unit=Unit.USD_MICROS, period="day", quota=5)  # type: ignore[arg-type]
    stored = w.engine.put_policy(q, allocate=True).policy
    assert stored.quota == 5 and stored.period is not None and stored.period.value == "day"
    (e,) = w.events
    kind, data = encode_event(e)
    assert decode_event(kind, json.loads(json.dumps(data))) == e
    clock = ManualClock(w.clock.now_ms())
    by_events = Engine.restore(None, w.events, clock, lambda e: None)
    snap = json.loads(json.dumps(w.engine.snapshot()))
    by_snapshot = Engine.restore(snap, [], clock, lambda e: None)
    for engine in (by_events, by_snapshot):
        (p,) = engine.state.policies.current()
        assert p == stored and p.quota == 5 and p.unit is Unit.USD_MICROS
    rate = TenantRatePolicy("acme", "read_iops", 1, 100, 10, 2)
    w.engine.put_policy(rate, allocate=True)
    assert (
        "period" not in encode_event(w.events[-1])[1]
        or encode_event(w.events[-1])[1]["period"] is None
    )

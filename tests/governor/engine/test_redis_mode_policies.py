"""governord stores redis-mode policies like any other mode (it is the mesh's policy store,
not the counter): the mode survives the event codec, a snapshot and a replay, and an unknown
mode is still refused naming the field."""

from __future__ import annotations

import pytest

from governor.engine import Engine, Event, ManualClock, decode_event, encode_event
from ratemesh.errors import ConfigError
from ratemesh.policy import Metric, Mode, TenantRatePolicy


def test_a_redis_mode_policy_is_stored_and_survives_replay() -> None:
    events: list[Event] = []
    clock = ManualClock(1_000)
    engine = Engine(clock, events.append)
    p = TenantRatePolicy("acme", Metric.READ_IOPS, 1, 100, 10, 5, mode=Mode.REDIS)
    stored = engine.put_policy(p, allocate=True).policy
    assert stored.mode is Mode.REDIS
    replayed = [decode_event(*encode_event(e)) for e in events]
    assert replayed == events
    for restored in (
        Engine.restore(None, replayed, ManualClock(2_000), lambda e: None),
        Engine.restore(engine.snapshot(), [], ManualClock(2_000), lambda e: None),
    ):
        (got,) = restored.state.policies.current()
        assert got.mode is Mode.REDIS and got == stored
    assert TenantRatePolicy.from_dict(stored.to_dict()).mode is Mode.REDIS


def test_an_unknown_mode_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError) as exc:
        TenantRatePolicy.from_dict(
            {
                "tenant_id": "acme",
                "metric": "read_iops",
                "generation": 1,
                "target_rate": 1,
                "global_burst": 1,
                "local_burst_cap": 1,
                "mode": "memcached",
            }
        )
    assert exc.value.field == "policy.mode" and "redis" in str(exc.value)

"""Garbage in: every public call returns a value or raises a GovernorError, and a raised error
changes nothing. Any other exception escaping the engine is a bug."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.engine import ROOT_ID, Engine, GovernorError, ManualClock, NodeState
from governor.testing.checks import canonical

pytestmark = pytest.mark.slow  # 400 hypothesis examples: several seconds

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=300),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=3),
    st.sampled_from([ROOT_ID, 2, 3, 4, 5, "http", "db", NodeState.DONE]),
)

CALLS = {
    "consume": lambda e, a: e.consume(a[0], a[1], a[2], a[3], request_id=a[4]),
    "acquire": lambda e, a: e.acquire(a[0], a[1], a[2], request_id=a[4]),
    "release": lambda e, a: e.release(a[0], a[1], latency_ms=a[2], overloaded=a[3]),
    "create_node": lambda e, a: e.create_node(a[0], a[1], a[2], quotas=a[3], limits=a[4]),
    "set_quota": lambda e, a: e.set_quota(a[0], a[1], a[2], a[3]),
    "set_limit": lambda e, a: e.set_limit(a[0], a[1], a[2], a[3]),
    "set_weight": lambda e, a: e.set_weight(a[0], a[1], a[2]),
    "set_deadline": lambda e, a: e.set_deadline(a[0], a[1], a[2]),
    "set_defaults": lambda e, a: e.set_defaults(a[0], a[1], a[2]),
    "end_node": lambda e, a: e.end_node(a[0], a[1], a[2]),
    "open_session": lambda e, a: e.open_session(a[0], a[1], a[2]),
    "heartbeat": lambda e, a: e.heartbeat(a[0]),
    "close_session": lambda e, a: e.close_session(a[0]),
    "validate": lambda e, a: e.validate(a[0]),
    "cancel_wait": lambda e, a: e.cancel_wait(a[0], a[1]),
    "take_outcome": lambda e, a: e.take_outcome(a[0], a[1]),
    "set_adaptive": lambda e, a: e.set_adaptive(a[0], a[1]),
    "effective_deadline_ms": lambda e, a: e.effective_deadline_ms(a[0]),
}


def _engine() -> Engine:
    engine = Engine(ManualClock(0), lambda event: None)
    t = engine.create_node(None, ROOT_ID, "t", quotas={"http": 5}, limits={"db": 1})
    engine.open_session(ROOT_ID, 1_000, hashlib.sha256(b"a").hexdigest())  # session 1
    engine.open_session(t.node_id, 1_000, hashlib.sha256(b"b").hexdigest())  # type: ignore[union-attr]
    engine.acquire(2, 2, "db")  # lease 3
    engine.acquire(2, 2, "db")  # waiter 1
    return engine


@settings(max_examples=400)
@given(name=st.sampled_from(sorted(CALLS)), args=st.lists(JUNK, min_size=5, max_size=5))
def test_junk_arguments_raise_only_governor_errors_and_change_nothing(
    name: str, args: list[Any]
) -> None:
    engine = _engine()
    before = canonical(engine)
    try:
        CALLS[name](engine, args)
    except GovernorError:
        assert canonical(engine) == before

"""`Dependencies`: a change of state is one log line (a repeat is none), a new reason while
down is said at most once per REASON_RELOG_S, and the gauge and counter follow the states."""

from __future__ import annotations

import io
import json
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mesh.telemetry._dependencies import REASON_RELOG_S, Dependencies
from ratemesh import logs


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _deps() -> tuple[Dependencies, Clock, io.StringIO]:
    out = io.StringIO()
    logs.configure(("t.deps",), "json", "INFO", out)
    clock = Clock()
    return Dependencies(clock, logging.getLogger("t.deps")), clock, out


def _lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_each_change_is_one_line_and_a_repeat_none() -> None:
    deps, clock, out = _deps()
    deps.declare("coordinator")
    assert deps.degraded()[0]["reason"] == "not answered yet"
    assert not deps.observe("coordinator", True)  # up from the start: nothing to say
    for _ in range(1000):  # a thousand probes of the same failure
        deps.observe("coordinator", False, "UNAUTHENTICATED: unknown API key")
    clock.now += 2.5
    assert deps.observe("coordinator", True)
    (down, up) = _lines(out)
    assert down["event"] == "dependency_down" and down["level"] == "warning"
    assert down["reason"] == "UNAUTHENTICATED: unknown API key"
    assert up["event"] == "dependency_up" and up["down_s"] == 2.5
    assert deps.states["coordinator"].failures == 1 and deps.degraded() == []


def test_a_new_reason_while_down_is_said_at_most_once_per_relog_interval() -> None:
    deps, clock, out = _deps()
    for i in range(50):
        deps.observe("governord", False, f"UNAVAILABLE: attempt {i}")
        clock.now += 0.25
    said = [e for e in _lines(out) if e["event"] == "dependency_down"]
    assert len(said) == 1 + int(50 * 0.25 // REASON_RELOG_S), said
    assert deps.degraded()[0]["reason"] == "UNAVAILABLE: attempt 49"  # /health: the latest


def test_the_gauge_and_the_counter() -> None:
    deps, _clock, _out = _deps()
    reg = CollectorRegistry()
    reg.register(deps)
    deps.declare("coordinator")
    text = generate_latest(reg).decode()
    assert "ratemesh_dependency_up{" not in text  # not heard from yet: absent
    deps.observe("coordinator", False, "down")
    deps.observe("coordinator", True)
    deps.observe("coordinator", False, "down again")
    text = generate_latest(reg).decode()
    assert 'ratemesh_dependency_up{dependency="coordinator"} 0.0' in text
    assert 'ratemesh_dependency_failures_total{dependency="coordinator"} 2.0' in text


def test_names_are_a_fixed_set_and_reasons_are_bounded() -> None:
    deps, _clock, _out = _deps()
    with pytest.raises(ValueError, match="unknown dependency"):
        deps.declare("anything")
    deps.observe("owners", False, "x" * 10_000)
    assert len(deps.states["owners"].reason) <= 300

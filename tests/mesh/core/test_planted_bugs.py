"""Planted bugs in the admission paths, each of which the model tests must catch.

Each bug is planted by monkeypatching the real core for one run of the seeded schedules of
test_model_local (the core twin) or test_model_fleet (the in-memory fleet), and the run
must report a violation within a bounded number of schedules. A bug that survives means
the models have gone blind to that class of mistake. The bugs are the shapes users found
(a full view charged at a stale time, a view numbering its reports from 1 again, refunds
past the burst) and their neighbours (the idle sweep forgetting usage, a gate refilled
twice, a cap ignored, an owner acknowledging without applying).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from mesh.core.admission import Admission
from mesh.core.admission._gates import LocalGate
from mesh.core.gate import Gate
from mesh.core.reporter import GlobalGate, Reporter
from tests.mesh.core.test_model_local import random_schedule
from tests.mesh.testing.test_model_fleet import run_schedule

LOCAL_TRIES = 3000  # core-twin schedules a planted bug may take to show (a few seconds)
FLEET_TRIES = 120  # fleet schedules (about 15 s)


@contextmanager
def planted(target: Any, name: str, fn: Callable[..., Any]) -> Iterator[None]:
    old = getattr(target, name)
    setattr(target, name, fn)
    try:
        yield
    finally:
        setattr(target, name, old)


# -- the bugs ----------------------------------------------------------------------------


def _mark_without_time(self: Admission, v: Gate) -> None:
    """A full view keeps the settle time of when it filled: its next use is charged then."""
    assert isinstance(v, LocalGate)
    v.marked = True
    v.flush_at = 1 << 62
    self._settle.add(v)


def _settle_refills_twice(self: LocalGate, now_ns: int) -> bool:
    """The refill since the last settle is counted, and what was admitted is not charged."""
    self.pending = 0
    self.settled_ns = now_ns
    self.denied = 0
    left = self.meter.remaining(now_ns)
    self.avail = left // self.scale
    return left >= self.meter.burst


def _refund_past_full(self: LocalGate, amount: int) -> None:
    """A refund adds to what may be admitted without a ceiling (and nets against pending)."""
    self.pending -= amount
    self.avail += amount


def _sweep_forgets_pending(self: Admission, v: Gate) -> bool:
    """The idle sweep forgets local views with usage not yet settled."""
    return isinstance(v, LocalGate) or isinstance(v, GlobalGate)


def _open_numbers_from_one(self: Reporter, policy: Any) -> GlobalGate:
    """A view made again numbers its reports from 1 (the owner takes them for duplicates)."""
    key = policy.rate_key
    v = self.gates.get(key)
    if v is None:
        v = self.gates[key] = GlobalGate(policy, self._sink_fn)
        self._boot(v, 0)
    self._retired.discard(key)
    return v


def _cap_ignored(
    remaining: int, share_ppm: int, active: int, local_burst_cap: int, need: int = 0
) -> int:
    """A view may hold its whole share of what remains, whatever b says."""
    return remaining * share_ppm


def _apply_nothing(self: object, now_ns: int, amount: int) -> None:
    """The owner acknowledges reports without charging them to the meter."""


LOCAL_BUGS: dict[str, tuple[Any, str, Callable[..., Any]]] = {
    "a full view charged at the time it filled": (Admission, "_mark_local", _mark_without_time),
    "a gate refilled twice (usage not charged)": (LocalGate, "settle", _settle_refills_twice),
    "a refund fills past the burst": (LocalGate, "refund", _refund_past_full),
    "the idle sweep forgets pending usage": (Admission, "_holds_nothing", _sweep_forgets_pending),
}


def _fleet_bugs() -> dict[str, tuple[Any, str, Callable[..., Any]]]:
    import mesh.core.gcra as gcra
    import mesh.core.reporter._gate as gate_mod

    return {
        "a view made again numbers its reports from 1": (
            Reporter,
            "open_gate",
            _open_numbers_from_one,
        ),
        "the local burst cap ignored": (gate_mod, "snapshot_allowance_ppm", _cap_ignored),
        "the owner acknowledges without applying": (gcra.Gcra, "apply", _apply_nothing),
    }


@pytest.mark.parametrize("name", sorted(LOCAL_BUGS))
def test_the_core_twin_catches(name: str) -> None:
    target, attr, fn = LOCAL_BUGS[name]
    with planted(target, attr, fn):
        for seed in range(LOCAL_TRIES):
            try:
                problems = random_schedule(seed).check()
            except Exception as exc:  # a planted bug may break an invariant loudly
                problems = [repr(exc)]
            if problems:
                return
    pytest.fail(f"{name}: no schedule of {LOCAL_TRIES} caught it")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_fleet_bugs()))
def test_the_fleet_model_catches(name: str) -> None:
    target, attr, fn = _fleet_bugs()[name]
    with planted(target, attr, fn):
        for seed in range(FLEET_TRIES):
            try:
                problems = run_schedule(seed).check()
            except Exception as exc:
                problems = [repr(exc)]
            if problems:
                return
    pytest.fail(f"{name}: no schedule of {FLEET_TRIES} caught it")

"""Planted bugs that the stateful envelope test must catch, so its power is pinned.

Each mutation is applied by monkeypatching the real core for the duration of one run of
`MeshMachine` (no shrinking, to keep the run short). A mutation that survives means the
stateful test has gone blind to that class of bug.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from mesh.core.gcra import NS_PER_S
from mesh.core.reporter import GlobalGate, SnapshotState
from mesh.core.reporter._gate import Inflight
from mesh.testing.fleet import Offered, drive
from tests.mesh.core.test_stateful import MeshMachine
from tests.mesh.testing.test_fleet import R, bound, fleet


def _no_cap(
    self: GlobalGate,
    order: tuple[int, int, int],
    remaining: int,
    ack: int,
    share_ppm: int,
    active_reporters: int,
    now_ns: int,
    ttl_ns: int,
    coin_ppm: int,
    above_mask: int = 0,
) -> list[Inflight]:
    """Spend the whole of `remaining`, ignoring the share and the local burst cap."""
    acked = self.ack(ack)
    self.applied_above = 0
    self.snap_order = order
    self.allowance = remaining
    self.fresh_until_ns = now_ns + ttl_ns
    self.state = SnapshotState.FRESH
    self.recompute()
    return acked


def _stale_keeps_spending(self: GlobalGate) -> None:
    self.avail = self.allowance - self.unacked


def _forget_unacked(self: GlobalGate) -> None:
    """Overwrite with the snapshot's figure: usage after the snapshot is forgotten."""
    self.avail = 0 if self.state is SnapshotState.STALE else self.allowance - self.pending


def _apply_nothing(self: object, now_ns: int, amount: int) -> None:
    """The owner acknowledges reports without charging them to the meter."""


MUTATIONS: dict[str, tuple[str, str, Callable[..., object]]] = {
    "no local burst cap": ("mesh.core.reporter._gate.GlobalGate", "take_snapshot", _no_cap),
    "stale views keep spending": (
        "mesh.core.reporter._gate.GlobalGate",
        "recompute",
        _stale_keeps_spending,
    ),
    "in-flight usage forgotten": (
        "mesh.core.reporter._gate.GlobalGate",
        "recompute",
        _forget_unacked,
    ),
}
# Bugs the small machine cannot expose (its three workers are too slow to outrun an owner
# that never charges) but a fleet under overload does.
FLEET_MUTATIONS: dict[str, tuple[str, str, Callable[..., object]]] = {
    "owner acknowledges without applying": ("mesh.core.gcra.Gcra", "apply", _apply_nothing),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_the_stateful_test_catches_the_planted_bug(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, attr, replacement = MUTATIONS[name]
    monkeypatch.setattr(f"{target}.{attr}", replacement)
    quick = settings(
        max_examples=600,
        stateful_step_count=50,
        deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
        derandomize=True,
        database=None,
    )
    with pytest.raises(AssertionError):
        run_state_machine_as_test(MeshMachine, settings=quick)


@pytest.mark.parametrize("name", sorted(FLEET_MUTATIONS))
def test_a_whole_fleet_under_overload_shows_the_planted_bug(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six members offered four times the limit: the lead over the ideal leaves the envelope."""
    target, attr, replacement = FLEET_MUTATIONS[name]
    monkeypatch.setattr(f"{target}.{attr}", replacement)
    worst = 0.0
    for seed in range(3):
        f = fleet(seed)
        d = Offered("t", 4 * R)
        drive(f, [d], f.now_ns + NS_PER_S)
        worst = max(worst, d.max_excess / bound(f, 6))
    assert worst > 1.0, f"{name}: the fleet stayed inside its envelope ({worst:.2f})"

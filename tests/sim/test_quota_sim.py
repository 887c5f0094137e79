"""The spend-quota scenario (sim/quota.py): the real quota core on the simulator's clock
and network. The mesh's fleet burn stays within cap + the peers' unfolded burn; local's
runs to N x cap; one seed replays the run exactly."""

from __future__ import annotations

import dataclasses

import pytest

from sim.runner import run
from sim.scenario import load, names

KEYS = (
    "admitted",
    "ideal",
    "max_excess",
    "mean_excess",
    "bound",
    "within_bound",
    "utilisation",
    "fairness",
    "quiet_share",
    "messages_per_worker_s",
    "round_trips_per_request",
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_mesh_converges_within_the_unfolded_lag(seed: int) -> None:
    sc = load("spend-quota")
    result, _ = run(sc, seed)
    assert result["scenario"] == "spend-quota" and result["seed"] == seed, seed
    mesh, local = result["strategies"]["mesh"], result["strategies"]["local"]
    for s in (mesh, local):
        assert set(KEYS) <= set(s), seed
    assert mesh["within_bound"], (seed, mesh)
    cap = mesh["cap"]
    # the cadence's peer burn (4000/s x 7/8 x 1 s, plus the owner's outage) is the bound
    assert mesh["max_excess"] <= mesh["bound"] <= cap, (seed, mesh)
    assert local["max_excess"] > mesh["max_excess"], (seed, local, mesh)
    assert mesh["per_tenant"]["small"]["admitted"] == mesh["per_tenant"]["small"]["offered"]


def test_same_seed_same_result_and_listed() -> None:
    assert "spend-quota" in names()
    sc = dataclasses.replace(load("spend-quota"), duration_s=2)
    assert run(sc, 5)[0] == run(sc, 5)[0]


def test_a_tighter_cadence_tightens_the_excess() -> None:
    sc = load("spend-quota")
    assert sc.quota is not None
    fast = dataclasses.replace(sc, quota=dataclasses.replace(sc.quota, publish_ms=100))
    slow_r, _ = run(sc, 1, ["mesh"])
    fast_r, _ = run(fast, 1, ["mesh"])
    assert fast_r["strategies"]["mesh"]["max_excess"] < slow_r["strategies"]["mesh"]["max_excess"]

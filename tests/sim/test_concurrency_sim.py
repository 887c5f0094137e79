"""The global-concurrency scenario (sim/concurrency.py): the real slot core on the
simulator's clock and network, with a worker killed holding slots, a partition and the
owner's crash. The global mode's fleet in-flight total stays within C + N x b on every seed
(in these runs, within C); share stays within its rounding; local runs to about N x C; one
seed replays the run exactly."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sim.runner import run
from sim.scenario import load
from sim.sweep import sweep

KEYS = ("admitted", "ideal", "max_excess", "bound", "within_bound", "utilisation", "fairness")


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_global_holds_its_disclosed_bound(seed: int) -> None:
    result, _ = run(load("global-concurrency"), seed)
    s = result["strategies"]
    mesh, share, local = s["mesh"], s["share"], s["local"]
    for r in (mesh, share, local):
        assert set(KEYS) <= set(r) and r["within_bound"], (seed, r)
    c, b = mesh["cap"], mesh["local_burst_cap"]
    assert mesh["bound"] == 6 * b, (seed, mesh)
    assert mesh["max_excess"] <= mesh["bound"], (seed, mesh)
    assert max(t["max_in_flight"] for t in mesh["per_tenant"].values()) <= c + 6 * b
    # the global mode admits real work (a grant is a round trip away, never on the path)
    assert mesh["utilisation"] >= 0.7 and mesh["round_trips_per_request"] == 0.0, (seed, mesh)
    # local does not coordinate: the busy tenant runs far past C
    assert local["per_tenant"]["busy"]["max_in_flight"] > 2 * c, (seed, local)


def test_same_seed_same_json_and_sweep_runs_it() -> None:
    sc = dataclasses.replace(load("global-concurrency"), duration_s=1.0)
    a, b = run(sc, 5)[0], run(sc, 5)[0]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    out = sweep(["global-concurrency"], seeds=2)
    row = out["scenarios"]["global-concurrency"]["mesh"]
    assert row["runs"] == 2 and row["within_bound"] == 2 and not row["failed_seeds"], row

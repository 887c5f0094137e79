"""Serving through partitions in the simulator (docs/partitions.md): quiet tenants
keep their ideal through partitions, the envelope holds however the fleet is cut, and the
floors (off by default, turned on here) cost scenarios without partitions nothing measurable."""

from __future__ import annotations

import dataclasses
import random

import pytest

from mesh.core.config import PARTITION_FLOOR_MS
from sim.runner import run
from sim.scenario import load, parse


def random_partitions(seed: int) -> dict[str, object]:
    """A scenario with a few partitions of random members, starts and lengths."""
    rng = random.Random(seed)
    workers = [f"w{i:04d}" for i in range(8)]
    faults = []
    at = 0.2
    for _ in range(3):
        members = rng.sample(workers, rng.randint(1, 4))
        length = rng.choice([0.05, 0.1, 0.3, 0.6, 1.2])
        faults.append({"kind": "partition", "members": members, "at_s": at, "until_s": at + length})
        at += length + rng.uniform(0.05, 0.3)
    return {
        "name": f"random-partitions-{seed}",
        "description": "random partitions",
        "duration_s": round(at + 0.3, 3),
        "warmup_s": 0.3,
        "fleet": {"workers": 8},  # floors on: the default
        "policy": {"rate": 2000, "burst": 200, "local_burst_cap": 40},
        "tenants": [
            {"name": "busy", "offered": 6000},
            {"name": "quiet", "offered": 400, "quiet": True},
        ],
        "network": {"latency_ms": 0.5, "jitter_ms": 0.5, "loss": rng.choice([0.0, 0.02])},
        "faults": faults,
    }


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_the_envelope_holds_through_random_partitions(seed: int) -> None:
    print(f"seed {seed}")
    sc = parse(random_partitions(seed))
    result, _ = run(sc, seed, ["mesh"])
    m = result["strategies"]["mesh"]
    assert m["within_bound"], (seed, sc.faults, m)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["partition", "half-partition"])
def test_quiet_tenants_keep_their_ideal_through_a_partition(name: str) -> None:
    for seed in range(3):
        m = run(load(name), seed, ["mesh"])[0]["strategies"]["mesh"]
        assert m["within_bound"], (seed, m)
        assert m["quiet_share"] >= 0.99, (seed, m)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["noisy-neighbour", "lb-skew", "egress-bytes"])
def test_floors_cost_sparse_reporters_nothing(name: str) -> None:
    """Where reporters pause often (sparse quiet tenants, a saturated key's large requests),
    an owner escrows their pauses as if they were cuts; with floors that follow usage (and
    none for a saturated member) that costs almost nothing (docs/partitions.md)."""
    seed = 0
    print(f"seed {seed}")
    sc = load(name)
    assert sc.fleet.partition_floor_ms == PARTITION_FLOOR_MS  # on by default: turned off here
    off = dataclasses.replace(sc, fleet=dataclasses.replace(sc.fleet, partition_floor_ms=0))
    on_m = run(sc, seed, ["mesh"])[0]["strategies"]["mesh"]
    off_m = run(off, seed, ["mesh"])[0]["strategies"]["mesh"]
    assert on_m["within_bound"], (seed, on_m)
    assert on_m["utilisation"] >= off_m["utilisation"] - 0.01, (seed, on_m, off_m)
    assert on_m["quiet_share"] >= off_m["quiet_share"] - 0.01, (seed, on_m, off_m)

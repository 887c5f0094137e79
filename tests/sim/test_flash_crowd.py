"""Issue 12: sixteen cold keys meeting a skewed, lossy fleet at once (flash-crowd) are served
to at least 0.97 of the ideal by the mesh, inside its envelope. Two seeds, the mesh alone,
full size (about 2.5 s each); `mesh sim sweep --scenarios flash-crowd` runs twenty."""

from __future__ import annotations

import pytest

from sim.runner import run_strategy
from sim.scenario import load


@pytest.mark.parametrize("seed", [1, 2])
def test_flash_crowd_cold_keys_warm_to_097_of_the_ideal(seed: int) -> None:
    sc = load("flash-crowd")
    figures = run_strategy(sc, seed, "mesh").summary
    assert figures["within_bound"], (seed, figures)
    assert figures["utilisation"] >= 0.97, (seed, figures["utilisation"])

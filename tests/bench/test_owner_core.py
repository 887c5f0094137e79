"""`python -m bench.owner core`: the owner's part of its bench in one process (counts and keys
only, never speed)."""

from __future__ import annotations

from bench.owner import core


def test_the_owner_core_bench_times_every_step_of_every_row() -> None:
    out = core(batches=8, warm=2)
    assert out["batches"] == 8 and out["batch"] == 256
    assert set(out["ns_per_row"]) == {"decode", "receive", "encode", "tick"}
    assert set(out["us_per_batch"]) == set(out["ns_per_row"])
    assert out["rows_per_cpu_s"] > 0
    assert out["ns_per_row"]["receive"] > 0

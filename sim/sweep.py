"""Many seeds of many scenarios, mesh only: does the envelope hold in every run?

The benchmark behind the simulator's targets: `mesh sim sweep --seeds 20` runs every shipped
scenario (scale excepted unless named) at full size and reports, per scenario, how many runs
stayed within `N*b + R*d` (over every interval of the recorded admissions), how many starved
no request, the worst figures seen, and the seeds of the runs that did not hold (to replay
with `mesh sim run --scenario NAME --seed N`).
"""

from __future__ import annotations

import time
from typing import Any

from sim.runner import Progress, run
from sim.scenario import load, names

__all__ = ["sweep"]


def sweep(
    scenarios: list[str] | None = None,
    seeds: int = 20,
    strategies: tuple[str, ...] = ("mesh",),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """`progress(done, total, "scenario seed N")` hears each run as it starts."""
    chosen = scenarios or [n for n in names() if n != "scale"]
    out: dict[str, Any] = {"seeds": seeds, "scenarios": {}}
    t0 = time.perf_counter()
    total, done = len(chosen) * seeds, 0
    for name in chosen:
        sc = load(name)
        rows = []
        for seed in range(seeds):
            if progress is not None:
                progress(done, total, f"{name} seed {seed}")
            rows.append(run(sc, seed, list(strategies))[0]["strategies"])
            done += 1
        per: dict[str, Any] = {}
        for strat in strategies:
            figs = [r[strat] for r in rows if strat in r]
            if not figs:  # not a strategy of this scenario (spend-quota runs mesh, local)
                continue
            per[strat] = {
                "runs": len(figs),
                "within_bound": sum(f["within_bound"] for f in figs),
                "within_bound_pct": round(
                    100.0 * sum(f["within_bound"] for f in figs) / len(figs), 2
                ),
                "max_excess_worst": max(f["max_excess"] for f in figs),
                "bound_min": min(f["bound"] for f in figs),
                "mean_excess_pct_of_rate_worst": max(f["mean_excess_pct_of_rate"] for f in figs),
                "utilisation_min": min(f["utilisation"] for f in figs),
                "starved_worst": max(f.get("starved", 0) for f in figs),
                "no_starvation": sum(f.get("starved", 0) == 0 for f in figs),
                "failed_seeds": [
                    seed
                    for seed, r in enumerate(rows)
                    if strat in r and (not r[strat]["within_bound"] or r[strat].get("starved"))
                ],
                "quiet_share_min": min(
                    (f["quiet_share"] for f in figs if f["quiet_share"] is not None), default=None
                ),
            }
        out["scenarios"][name] = per
    if progress is not None:
        progress(done, total, "done")
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out

"""`mesh demo --memory`: the main job's scenario over the in-memory network, no sockets.

Eight workers share two tenants' fleet-wide limits through the real mesh cores, joined by
the in-memory network: a noisy tenant offering four times its limit and a quiet one under
its limit. The demo prints what each tenant got beside the ideal (one exact GCRA seeing
every request) and the envelope `N*b + R*d` the mesh promises.
"""

from __future__ import annotations

from typing import Any

from mesh.core.config import MS
from mesh.core.gcra import NS_PER_S
from mesh.core.policy import Metric, PolicyCache, TenantRatePolicy
from mesh.testing.fleet import MemoryFleet, Offered, drive

__all__ = ["run_demo"]

def run_demo(*, seconds: float = 3.0, seed: int = 1, workers: int = 8) -> dict[str, Any]:
    tenants = {
        # tenant: (R per s, B, b, offered per s across the fleet)
        "noisy": (2000, 200, 40, 8000),
        "quiet": (500, 50, 20, 300),
    }
    policies = PolicyCache(
        TenantRatePolicy(t, Metric.READ_IOPS, 1, r, burst, b) for t, (r, burst, b, _) in
        tenants.items()
    )
    ids = [f"worker-{i}" for i in range(workers)]
    fleet = MemoryFleet(ids, policies, seed=seed)
    warmup_ns = NS_PER_S // 2  # owners start conservatively; let the ring settle first
    fleet.run_until(warmup_ns)
    demand = [Offered(t, offered) for t, (_, _, _, offered) in tenants.items()]
    drive(fleet, demand, warmup_ns + int(seconds * NS_PER_S))
    stats = {d.tenant: d.report() for d in demand}
    d_ns = fleet.propagation_delay_ns()
    out: dict[str, Any] = {"workers": workers, "seconds": seconds, "seed": seed,
                           "d_ms": d_ns / MS, "tenants": {}}
    for t, (r, _, b, offered) in tenants.items():
        s = stats[t]
        bound = workers * b + r * d_ns / NS_PER_S
        out["tenants"][t] = {
            "limit_per_s": r,
            "offered_per_s": offered,
            "admitted": s["admitted"],
            "ideal": s["ideal"],
            "max_excess": s["max_excess"],
            "bound": round(bound, 1),
            "within_bound": s["max_excess"] <= bound,
            "utilisation": round(s["admitted"] / s["ideal"], 4) if s["ideal"] else 1.0,
        }
    out["messages_per_worker_s"] = round(fleet.messages / workers / (seconds + 0.5), 1)
    return out

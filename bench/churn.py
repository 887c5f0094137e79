"""`mesh bench churn`: many new tenants touched once, then idle; does the memory come back?

One real node (`Mesh`, a global limit for every tenant through the default tenant "*", its
own owner over the in-memory transport, decisions counted for /metrics) sees `tenants`
distinct tenants once each, then nothing for `idle_s` seconds. The core's idle timeouts are
shortened (views_idle_ms, idempotency_retention_ms) so the run takes seconds; the node's
forget pass (every DECISIONS_IDLE_S) is called at the end as if one and two such periods had
passed, instead of waited for.

Keys: rss_growth_mb (RSS after the idle phase minus before the tenants came, after a full
collection), rss_peak_growth_mb, metrics_bytes (/metrics while all tenants are active),
metrics_tenant_labels, and what is left: views, reporter_gates, owner_keys, decision_entries.
Figures are this process's RSS, so they vary with the allocator and the machine; `allocator`
says which one ran (`PYTHONMALLOC`: CPython's own `pymalloc` unless it names another). Under
pymalloc what stays is arenas pinned by a few live objects (README, `bench churn`); under
`malloc` the node's `malloc_trim` gives back every free page.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import time
from typing import Any

from mesh.node import Mesh
from mesh.node._driver import FORGET_IDLE_NS
from mesh.peer import MemoryNetwork, MemoryTransport

__all__ = ["run"]

POLICY = {
    "tenant_id": "*",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 1000,
    "global_burst": 100,
    "local_burst_cap": 20,
    "mode": "global",
}


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:  # not Linux: the peak is all there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(*, tenants: int = 250_000, idle_s: float = 3.0, top_k: int = 50) -> dict[str, Any]:
    return asyncio.run(_run(tenants, idle_s, top_k))


async def _run(tenants: int, idle_s: float, top_k: int) -> dict[str, Any]:
    cfg = {
        "member_id": "churn",
        "telemetry_top_k": top_k,
        "policies": {"inline": [POLICY]},
        "core": {"views_idle_ms": 200, "idempotency_retention_ms": 500},
    }
    net = MemoryNetwork()
    async with Mesh(cfg, transport=lambda mid, e, h: MemoryTransport(net, mid, h.deliver)) as mesh:
        driver = mesh._require()
        await asyncio.sleep(0.1)
        gc.collect()
        rss0 = _rss_mb()
        t0 = time.perf_counter()
        for i in range(tenants):
            mesh.try_admit(f"tenant-{i}", "read_iops")
            if i % 1000 == 999:
                await asyncio.sleep(0)  # let the node tick, report and snapshot
        touch_s = time.perf_counter() - t0
        await asyncio.sleep(0.05)
        metrics = driver.telemetry.render()
        gc.collect()
        rss_peak = _rss_mb()
        await asyncio.sleep(idle_s)
        driver.forget_idle(driver.clock_ns() + FORGET_IDLE_NS)
        driver.forget_idle(driver.clock_ns() + 2 * FORGET_IDLE_NS)
        driver.telemetry.render()  # a scrape, as Prometheus makes every 15 s
        m = driver.member
        left = {
            "views": m.admission.gate_count,
            "reporter_gates": len(m.reporter.gates),
            "owner_keys": len(m.owner.keys),
            "decision_entries": len(driver.telemetry.decisions),
        }
        gc.collect()
        rss1 = _rss_mb()
    labels = {
        line[line.index('tenant="') + 8 :].split('"', 1)[0]
        for line in metrics.decode().splitlines()
        if 'tenant="' in line
    }
    return {
        "tenants": tenants,
        "idle_s": idle_s,
        "allocator": os.environ.get("PYTHONMALLOC") or "pymalloc",
        "touch_s": round(touch_s, 2),
        "rss_start_mb": round(rss0, 1),
        "rss_peak_growth_mb": round(rss_peak - rss0, 1),
        "rss_growth_mb": round(rss1 - rss0, 1),
        "metrics_bytes": len(metrics),
        "metrics_tenant_labels": len(labels),
        **left,
    }

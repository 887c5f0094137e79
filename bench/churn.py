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
With `waves` > 1 as many more waves of new tenants follow, each then idle:
`rss_growth_by_wave_mb` is the growth after each (a plateau, not a sum, if what stays is
reused by the next tenants).
Figures are this process's RSS, so they vary with the allocator and the machine; `allocator`
says which one ran (`PYTHONMALLOC`: CPython's own `pymalloc` unless it names another). Under
pymalloc what stays is arenas pinned by a few live objects (docs/figures.md, `bench churn`); under
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


def run(
    *, tenants: int = 250_000, idle_s: float = 3.0, top_k: int = 50, waves: int = 1
) -> dict[str, Any]:
    return asyncio.run(_run(tenants, idle_s, top_k, waves))


async def _run(tenants: int, idle_s: float, top_k: int, waves: int) -> dict[str, Any]:
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
        by_wave: list[float] = []
        for wave in range(waves):
            # Each wave's tenants are new: a later wave shows whether what stays is a
            # plateau the next tenants reuse, or grows with every tenant ever seen.
            prefix = "tenant-" if wave == 0 else f"w{wave}-tenant-"
            t0 = time.perf_counter()
            for i in range(tenants):
                mesh.try_admit(f"{prefix}{i}", "read_iops")
                if i % 1000 == 999:
                    await asyncio.sleep(0)  # let the node tick, report and snapshot
            if wave == 0:
                touch_s = time.perf_counter() - t0
                await asyncio.sleep(0.05)
                metrics = driver.telemetry.render()
                gc.collect()
                rss_peak = _rss_mb()
            await asyncio.sleep(idle_s)
            # The node's forget pass, as if one and then two of its periods had passed.
            now = driver.clock_ns() + 2 * wave * FORGET_IDLE_NS
            driver.forget_idle(now + FORGET_IDLE_NS)
            driver.forget_idle(now + 2 * FORGET_IDLE_NS)
            driver.telemetry.render()  # a scrape, as Prometheus makes every 15 s
            gc.collect()
            by_wave.append(round(_rss_mb() - rss0, 1))
        m = driver.member
        left = {
            "views": m.admission.gate_count,
            "reporter_gates": len(m.reporter.gates),
            "owner_keys": len(m.owner.keys),
            "decision_entries": len(driver.telemetry.decisions),
        }
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
        "rss_growth_mb": by_wave[0],
        "rss_growth_by_wave_mb": by_wave,
        "metrics_bytes": len(metrics),
        "metrics_tenant_labels": len(labels),
        **left,
    }

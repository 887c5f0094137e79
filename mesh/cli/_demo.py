"""`mesh demo`: the main job on its embedded default, a noisy and a quiet tenant.

A noisy tenant offers four times its fleet-wide limit and a quiet one stays under its own.
The demo prints what each tenant got beside the ideal (one exact GCRA seeing every request)
and the envelope `N*b + R*d` the mesh promises. Two drivers of the same table:

* loopback (the default, `--loopback`): three real members on loopback gRPC, a live row on
  stderr every second;
* `--memory`: eight workers' mesh cores joined by the in-memory network, no sockets, one
  seed deciding the run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any, NamedTuple

from ratemesh.checks import check_int
from ratemesh.envelope import d_estimate_ns, excess_bound
from ratemesh.errors import ConfigError
from ratemesh.ports import free_port

from ._output import emit, positive_s

__all__ = ["TENANTS", "DemoTenant", "demo", "run_loopback", "run_memory"]


class DemoTenant(NamedTuple):
    rate_per_s: int  # R, the fleet-wide limit
    burst: int  # B, the fleet-wide burst
    local_burst_cap: int  # b, what one member may spend before it hears from the owner
    offered_per_s: int  # across the fleet


TENANTS = {
    "noisy": DemoTenant(2000, 200, 40, 8000),
    "quiet": DemoTenant(500, 50, 20, 300),
}
BUCKET_S = 0.01  # the loopback demo counts admissions in 10 ms buckets


def demo(args: argparse.Namespace) -> int:
    if args.loopback and args.memory:
        raise ConfigError("--loopback", "--loopback and --memory exclude each other")
    seconds = positive_s("--seconds", args.seconds)
    workers = (8 if args.memory else 3) if args.workers is None else args.workers
    check_int("--workers", workers, minimum=1)
    if args.memory:
        emit(run_memory(seconds=seconds, seed=args.seed, workers=workers), args)
    else:
        emit(run_loopback(seconds=seconds, workers=workers), args)
    return 0


def _row(
    tenant: DemoTenant,
    admitted: int,
    ideal: int,
    excess: float,
    bound: float,
    *,
    excess_shown: float | None = None,
) -> dict[str, Any]:
    return {
        "limit_per_s": tenant.rate_per_s,
        "offered_per_s": tenant.offered_per_s,
        "admitted": admitted,
        "ideal": ideal,
        "max_excess": excess if excess_shown is None else excess_shown,
        "bound": round(bound, 1),
        "within_bound": excess <= bound,
        "utilisation": round(admitted / ideal, 4) if ideal else 1.0,
    }


# -- over the in-memory network ----------------------------------------------------------


def run_memory(*, seconds: float = 3.0, seed: int = 1, workers: int = 8) -> dict[str, Any]:
    from mesh.core.config import MS
    from mesh.core.gcra import NS_PER_S
    from mesh.core.member import Member
    from mesh.core.policy import Metric, PolicyCache, TenantRatePolicy
    from mesh.testing.fleet import MemoryFleet, Offered, drive

    policies = PolicyCache(
        TenantRatePolicy(name, Metric.READ_IOPS, 1, t.rate_per_s, t.burst, t.local_burst_cap)
        for name, t in TENANTS.items()
    )
    delays: list[int] = []  # report-to-acknowledgement, every member's: d as /health has it

    def hook(member: Member) -> None:
        member.reporter.on_ack = delays.append

    fleet = MemoryFleet(
        [f"worker-{i}" for i in range(workers)], policies, seed=seed, on_member=hook
    )
    warmup_ns = NS_PER_S // 2  # owners start conservatively; let the ring settle first
    fleet.run_until(warmup_ns)
    demand = [Offered(name, t.offered_per_s) for name, t in TENANTS.items()]
    drive(fleet, demand, warmup_ns + int(seconds * NS_PER_S))
    stats = {d.tenant: d.report() for d in demand}
    d_ns = d_estimate_ns(
        delays, fleet.config.sync_interval_ns, horizon_ns=fleet.config.owner_unreachable_ns
    )
    out: dict[str, Any] = {
        "workers": workers,
        "seconds": seconds,
        "seed": seed,
        "d_ms": d_ns / MS,
        "tenants": {},
    }
    for name, t in TENANTS.items():
        s = stats[name]
        bound = excess_bound(workers, t.local_burst_cap, t.rate_per_s, d_ns)
        out["tenants"][name] = _row(t, s["admitted"], s["ideal"], s["max_excess"], bound)
    out["messages_per_worker_s"] = round(fleet.messages / workers / (seconds + 0.5), 1)
    return out


# -- real members on loopback gRPC -------------------------------------------------------


def run_loopback(*, seconds: float = 3.0, workers: int = 3) -> dict[str, Any]:
    from mesh.node import new_event_loop

    loop = new_event_loop()
    try:
        return loop.run_until_complete(_loopback(seconds, workers))
    finally:
        loop.close()


async def _loopback(seconds: float, workers: int) -> dict[str, Any]:
    from mesh.node import Mesh

    members = {f"worker-{i}": f"127.0.0.1:{free_port()}" for i in range(workers)}
    policies = [
        {
            "tenant_id": name,
            "metric": "read_iops",
            "generation": 1,
            "target_rate": t.rate_per_s,
            "global_burst": t.burst,
            "local_burst_cap": t.local_burst_cap,
        }
        for name, t in TENANTS.items()
    ]
    meshes = [
        Mesh(
            {
                "member_id": m,
                "listen": addr,
                "shutdown_drain_ms": 200,
                "membership": {"source": "static", "members": members},
                "policies": {"inline": policies},
            }
        )
        for m, addr in members.items()
    ]
    started: list[Mesh] = []
    try:
        for mesh in meshes:
            await mesh.astart()
            started.append(mesh)
        await asyncio.sleep(0.5)  # the ring settles; owners then start keys full
        buckets = await _offer(meshes, seconds)
        d_ns = _d_ns(meshes)
    finally:
        for mesh in started:
            await mesh.aclose()
    out: dict[str, Any] = {
        "workers": workers,
        "seconds": seconds,
        "transport": "grpc",
        "d_ms": round(d_ns / 1e6, 3),
        "tenants": {},
    }
    for name, t in TENANTS.items():
        admitted = sum(buckets[name])
        ideal = min(int(t.offered_per_s * seconds), int(t.burst + t.rate_per_s * seconds))
        excess = _excess(buckets[name], t)
        bound = excess_bound(workers, t.local_burst_cap, t.rate_per_s, d_ns)
        out["tenants"][name] = _row(
            t, admitted, ideal, excess, bound, excess_shown=round(excess, 1)
        )
    return out


def _d_ns(meshes: list[Any]) -> int:
    """d (`ratemesh.envelope.d_estimate_ns`) over every member's recent delays."""
    drivers = [mesh._require() for mesh in meshes]
    delays = [d for driver in drivers for d in driver.recent_delays_ns]
    core = drivers[0].config.core
    return d_estimate_ns(delays, core.sync_interval_ns, horizon_ns=core.owner_unreachable_ns)


def _excess(buckets: list[int], tenant: DemoTenant) -> float:
    from mesh.telemetry import excess_over_windows

    return excess_over_windows(buckets, tenant.rate_per_s, tenant.burst, BUCKET_S)


async def _offer(meshes: list[Any], seconds: float) -> dict[str, list[int]]:
    n = int(seconds / BUCKET_S) + 1
    buckets = {name: [0] * n for name in TENANTS}
    carry = dict.fromkeys(TENANTS, 0.0)
    start = last = time.monotonic()
    next_row = 1.0
    while (now := time.monotonic()) - start < seconds:
        idx = min(int((now - start) / BUCKET_S), n - 1)
        for name, t in TENANTS.items():
            carry[name] += t.offered_per_s * (now - last)
            k = int(carry[name])
            carry[name] -= k
            for i in range(k):
                buckets[name][idx] += meshes[i % len(meshes)].try_admit(name, "read_iops").allowed
        last = now
        if now - start >= next_row:
            d_ns = _d_ns(meshes)
            row = "  ".join(
                f"{name}: {sum(buckets[name]) / (now - start):6.0f}/s of {t.rate_per_s}/s, "
                f"excess {_excess(buckets[name][: idx + 1], t):6.1f} "
                f"(bound {excess_bound(len(meshes), t.local_burst_cap, t.rate_per_s, d_ns):.0f})"
                for name, t in TENANTS.items()
            )
            print(f"[{now - start:4.1f}s] {row}", file=sys.stderr, flush=True)
            next_row += 1.0
        await asyncio.sleep(0.001)
    return buckets

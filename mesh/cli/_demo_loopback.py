"""`mesh demo --loopback`: three real members on loopback gRPC, live.

A noisy tenant offers four times its fleet-wide limit and a quiet one stays under its
own. Every second a row goes to stderr: what each tenant got beside its limit, and the
measured excess (the largest lead over an exact limiter in any window) against the bound
N*b + R*d. It stops by itself and returns one JSON-able summary.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from typing import Any

from mesh.node._mesh import Mesh, new_event_loop
from mesh.telemetry import excess_over_windows

__all__ = ["run_loopback_demo"]

BUCKET_S = 0.01
TENANTS = {  # tenant: (R per s, B, b, offered per s across the fleet)
    "noisy": (2000, 200, 40, 8000),
    "quiet": (500, 50, 20, 300),
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_loopback_demo(*, seconds: float = 5.0, workers: int = 3) -> dict[str, Any]:
    loop = new_event_loop()
    try:
        return loop.run_until_complete(_demo(seconds, workers))
    finally:
        loop.close()


async def _demo(seconds: float, workers: int) -> dict[str, Any]:
    members = {f"worker-{i}": f"127.0.0.1:{_port()}" for i in range(workers)}
    policies = [{"tenant_id": t, "metric": "read_iops", "generation": 1, "target_rate": r,
                 "global_burst": burst, "local_burst_cap": b}
                for t, (r, burst, b, _) in TENANTS.items()]
    meshes = [Mesh({"member_id": m, "listen": addr, "shutdown_drain_ms": 200,
                    "membership": {"source": "static", "members": members},
                    "policies": {"inline": policies}}) for m, addr in members.items()]
    for mesh in meshes:
        await mesh.astart()
    try:
        await asyncio.sleep(0.5)  # the ring settles; owners then start keys full
        buckets = await _offer(meshes, seconds)
        d_s = max(max([0, *mesh._require().recent_delays_ns]) for mesh in meshes) / 1e9
    finally:
        for mesh in meshes:
            await mesh.aclose()
    d_s = max(d_s, 0.01)
    out: dict[str, Any] = {"workers": workers, "seconds": seconds, "transport": "grpc",
                           "d_ms": round(d_s * 1000, 3), "tenants": {}}
    for t, (r, burst, b, offered) in TENANTS.items():
        admitted = sum(buckets[t])
        ideal = min(int(offered * seconds), int(burst + r * seconds))
        excess = excess_over_windows(buckets[t], r, burst, BUCKET_S)
        bound = workers * b + r * d_s
        out["tenants"][t] = {
            "limit_per_s": r, "offered_per_s": offered, "admitted": admitted, "ideal": ideal,
            "max_excess": round(excess, 1), "bound": round(bound, 1),
            "within_bound": excess <= bound,
            "utilisation": round(admitted / ideal, 4) if ideal else 1.0,
        }
    return out


async def _offer(meshes: list[Mesh], seconds: float) -> dict[str, list[int]]:
    n = int(seconds / BUCKET_S) + 1
    buckets = {t: [0] * n for t in TENANTS}
    carry = {t: 0.0 for t in TENANTS}
    start = last = time.monotonic()
    next_row = 1.0
    while (now := time.monotonic()) - start < seconds:
        idx = min(int((now - start) / BUCKET_S), n - 1)
        for t, (_, _, _, offered) in TENANTS.items():
            carry[t] += offered * (now - last)
            k = int(carry[t])
            carry[t] -= k
            for i in range(k):
                buckets[t][idx] += meshes[i % len(meshes)].try_admit(t, "read_iops").allowed
        last = now
        if now - start >= next_row:
            row = "  ".join(
                f"{t}: {sum(buckets[t]) / (now - start):6.0f}/s of {r}/s, excess "
                f"{excess_over_windows(buckets[t][:idx + 1], r, burst, BUCKET_S):6.1f} "
                f"(bound {len(meshes) * b + r * 0.01:.0f})"
                for t, (r, burst, b, _) in TENANTS.items())
            print(f"[{now - start:4.1f}s] {row}", file=sys.stderr, flush=True)
            next_row += 1.0
        await asyncio.sleep(0.001)
    return buckets

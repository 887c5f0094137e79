"""A global in-flight cap across three real nodes (real gRPC on loopback, static
membership), one of them a separate process: the fleet never holds more than C while every
member reports, and when that process is SIGKILLed holding slots, its owner drops it after
the member TTL and the survivors get its slots back (docs/policies.md, concurrency)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest

from bench._procs import free_port
from mesh.core.concurrency import SlotTimings, global_excess, ring_key
from mesh.core.ring import Ring
from mesh.node import Mesh

pytestmark = pytest.mark.slow  # a worker process and three nodes

C, B = 6, 4
IDS = ["a", "b", "c"]

# The killed worker: a threaded node that takes B slots, says so, and holds them.
WORKER = """
import json, sys, time
from mesh.node import Mesh
cfg, tenant = json.loads(sys.argv[1]), sys.argv[2]
mesh = Mesh(cfg).start()
held = []
while len(held) < int(sys.argv[3]):
    v = mesh.acquire_slot(tenant, "origin_loads")
    if v.allowed:
        held.append(v.lease)
    time.sleep(0.005)
print("held", len(held), flush=True)
time.sleep(600)
"""


def _config(m: str, addrs: dict[str, str], tenant: str) -> dict[str, Any]:
    return {
        "member_id": m,
        "listen": addrs[m],
        "shutdown_drain_ms": 200,
        "membership": {"source": "static", "members": addrs},
        "policies": {
            "inline": [
                {
                    "tenant_id": tenant,
                    "metric": "origin_loads",
                    "generation": 1,
                    "mode": "global",
                    "concurrency": C,
                    "local_burst_cap": B,
                }
            ]
        },
    }


def test_the_fleet_holds_c_and_a_killed_workers_slots_come_back() -> None:
    ring = Ring(IDS, 1)
    tenant = next(
        t
        for t in (f"t{i}" for i in range(500))
        if ring.owner_of(ring_key((t, "origin_loads"))) == "a"
    )
    addrs = {m: f"127.0.0.1:{free_port()}" for m in IDS}
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, json.dumps(_config("c", addrs, tenant)), tenant, str(B)],
        stdout=subprocess.PIPE,
        text=True,
    )

    async def main() -> None:
        async with Mesh(_config("a", addrs, tenant)) as a, Mesh(_config("b", addrs, tenant)) as b:
            nodes = {"a": a, "b": b}
            held: dict[str, list[int]] = {"a": [], "b": []}

            def take() -> int:
                """One acquire on a and on b; what they hold together after it."""
                for m, node in nodes.items():
                    v = node.acquire_slot(tenant, "origin_loads")
                    if v.allowed:
                        held[m].append(v.lease)
                return sum(map(len, held.values()))

            assert worker.stdout is not None
            line = await asyncio.get_running_loop().run_in_executor(None, worker.stdout.readline)
            assert line.split() == ["held", str(B)], line
            most = 0
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                most = max(most, take())
                await asyncio.sleep(0.005)
            # every member reports: a and b hold at most what c's B leaves of C
            assert most <= C - B, (most, held)
            assert most + B <= C + global_excess(len(IDS), B)  # the disclosed bound, a fortiori
            worker.kill()  # SIGKILL: its B slots are held by nobody now
            worker.wait(10)
            t0 = time.monotonic()

            async def poll() -> None:
                while take() < C:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(poll(), 10)
            waited = time.monotonic() - t0
            assert sum(map(len, held.values())) == C, held  # all of C, never more
            # not before the owner could know: a grant lives a lease, a member a member TTL
            assert waited >= SlotTimings().lease_ttl_ms / 1000 * 0.5, waited
            assert a.health()["membership"]["N"] == 3
            owner = a.health()["concurrency"]  # a owns the scope: it dropped c, once
            assert owner["members_dropped"] == 1 and owner["owned_members"] == 2, owner
            assert b.health()["concurrency"]["in_flight"] == len(held["b"])

    try:
        asyncio.run(main())
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait(10)
        if worker.stdout is not None:
            worker.stdout.close()

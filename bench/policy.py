"""`mesh bench policy`: how long a pushed policy generation takes to be enforced on every
member of a real fleet (DESIGN.md section 5: p99 <= 100 ms on 4 nodes).

`nodes` real `mesh node` processes on loopback (static membership, `policies.coordinator`
pointing at the coordinator) learn a limit's generations from a coordinator that this
process pushes to. Each push puts a new generation of one limit; when the put's reply
arrives the clock starts, and every node's /health (`policies.enforced`,
read with a bare HTTP/1.1 GET, about 0.6 ms on loopback) is polled every POLL_MS until it
names that generation. A push's propagation is the last node's first sighting minus the
reply: an upper bound on the true figure by at most one poll interval plus one /health
round trip (the nodes have no watch to tell us sooner). Pushes are sequential.

Keys: nodes, pushes, propagation_p50_ms, propagation_p99_ms (over pushes), diverged_nodes
(nodes not enforcing the last generation SETTLE_S after it was pushed: 0 is converged),
push_timeouts (pushes some node had not enforced within SETTLE_S), target_p99_ms,
within_target, poll_ms, coordinator.

The coordinator is a real governord process (`governord_coordinator`: SQLite in a temporary
directory, a coordinator-scope key to push with and a worker-scope key the nodes watch with);
each put returns once governord committed it. `in_process_coordinator` (mesh.peer's
in-memory CoordinatorServer) is kept for comparing the cost of governord's commit.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench._procs import free_port, read_ready, spawn, stop, write_config
from ratemesh.checks import address_parts
from ratemesh.envelope import percentile

__all__ = ["run", "governord_coordinator", "in_process_coordinator", "Coordinator"]

POLL_MS = 2  # how often each node's /health is read while a push propagates
SETTLE_S = 5.0  # how long a push may take before its node counts as diverged
GAP_S = 0.02  # between a push being enforced everywhere and the next push
TARGET_P99_MS = 100.0  # DESIGN.md section 5
LIMIT: dict[str, Any] = {
    "tenant_id": "bench",
    "metric": "read_iops",
    "target_rate": 1000,
    "global_burst": 100,
    "local_burst_cap": 20,
}

Push = Callable[[dict[str, Any]], Awaitable[int]]  # put a policy; its generation, once put
# (the address nodes dial, the nodes' `policies.coordinator` extras, the push function, the
# cleanup, what it is)
Coordinator = tuple[str, dict[str, Any], Push, Callable[[], Awaitable[None]], str]
NODE_KEY_ENV = "RATEMESH_BENCH_NODE_KEY"  # the worker-scope key the nodes watch with


async def in_process_coordinator() -> Coordinator:
    """An in-memory CoordinatorServer on a free loopback port, and a gRPC client to push."""
    from mesh.coordinator import PolicyStore
    from mesh.peer import CoordinatorClient
    from mesh.testing.coordinator import CoordinatorServer

    server = CoordinatorServer(PolicyStore())
    addr = await server.start()
    client = CoordinatorClient(addr)

    async def push(policy: dict[str, Any]) -> int:
        return (await client.put(policy)).generation

    async def close() -> None:
        await client.close()
        await server.stop()

    return addr, {}, push, close, "in-process CoordinatorServer (mesh.testing)"


async def governord_coordinator() -> Coordinator:
    """A governord process on SQLite in a temporary directory, serving the coordinator API
    with a pushing key and a watching key; a gRPC client pushes with the first."""
    import secrets

    from mesh.peer import CoordinatorClient

    tmp = tempfile.TemporaryDirectory(prefix="ratemesh-bench-governord-")
    addr = f"127.0.0.1:{free_port()}"
    push_key, node_key = secrets.token_hex(16), secrets.token_hex(16)
    cfg = write_config(
        Path(tmp.name) / "governord.yaml",
        {
            "listen": addr,
            "store": f"sqlite:{Path(tmp.name) / 'governord.db'}",
            "coordinator": {
                "keys": {
                    "bench": {"api_key_env": "RATEMESH_BENCH_PUSH_KEY", "scope": "coordinator"},
                    "nodes": {"api_key_env": NODE_KEY_ENV, "scope": "worker"},
                }
            },
        },
    )
    proc = spawn(
        ["-m", "governor.cli", "--config", str(cfg)],
        env={"RATEMESH_BENCH_PUSH_KEY": push_key, NODE_KEY_ENV: node_key},
    )
    line = await asyncio.to_thread(_first_line, proc, 60.0)
    if not line.startswith("LISTENING"):
        stop(proc)
        tmp.cleanup()
        raise RuntimeError(f"governord did not start: {line!r}")
    client = CoordinatorClient(addr, api_key=push_key)

    async def push(policy: dict[str, Any]) -> int:
        return (await client.put(policy)).generation

    async def close() -> None:
        await client.close()
        await asyncio.to_thread(stop, proc)
        tmp.cleanup()

    os.environ[NODE_KEY_ENV] = node_key  # the nodes this process spawns inherit it
    return addr, {"api_key_env": NODE_KEY_ENV}, push, close, "governord (SQLite)"


def _first_line(proc: Any, timeout_s: float) -> str:
    """The first line a child prints on stdout, or "" if it printed none in time."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        return str(proc.stdout.readline()) if sel.select(timeout_s) else ""
    finally:
        sel.close()


def run(*, nodes: int = 4, pushes: int = 100, in_process: bool = False) -> dict[str, Any]:
    coordinator = in_process_coordinator if in_process else governord_coordinator
    return asyncio.run(_run(nodes, pushes, coordinator))


async def _run(
    nodes: int, pushes: int, coordinator: Callable[[], Awaitable[Coordinator]]
) -> dict[str, Any]:
    addr, extras, push, close, what = await coordinator()
    ids = [f"node-{i}" for i in range(nodes)]
    members = {m: f"127.0.0.1:{free_port()}" for m in ids}
    procs = []
    try:
        with tempfile.TemporaryDirectory(prefix="ratemesh-bench-policy-") as tmp:
            cfg = write_config(
                Path(tmp) / "node.yaml",
                {
                    "membership": {"source": "static", "members": members},
                    "policies": {"coordinator": {"addr": addr, "poll_ttl_ms": 1000, **extras}},
                    "telemetry_listen": "127.0.0.1:0",
                    "shutdown_drain_ms": 300,
                },
            )
            for m in ids:
                args = ["-m", "mesh.cli", "node", "--config", str(cfg), "--member-id", m]
                procs.append(spawn([*args, "--listen", members[m]]))
            ready = [await asyncio.to_thread(read_ready, p, 60.0) for p in procs]
        return {
            **await _measure([r["telemetry"] for r in ready], push, pushes),
            "coordinator": what,
        }
    finally:
        for p in procs:
            await asyncio.to_thread(stop, p)
        await close()


async def _measure(health: list[str], push: Push, pushes: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    generation = await push(dict(LIMIT, target_rate=LIMIT["target_rate"]))
    await _enforced_everywhere(health, generation)  # warm-up: not measured
    took: list[float] = []
    timeouts = 0
    for i in range(pushes):
        generation = await push(dict(LIMIT, target_rate=LIMIT["target_rate"] + i + 1))
        t0 = loop.time()
        seen = await _enforced_everywhere(health, generation)
        if seen is None:
            timeouts += 1
        else:
            took.append(max(0.0, seen - t0) * 1000)
        await asyncio.sleep(GAP_S)
    final = await asyncio.gather(*(_generation(url) for url in health))
    p99 = _pct(took, 0.99)
    return {
        "nodes": len(health),
        "pushes": pushes,
        "propagation_p50_ms": _pct(took, 0.50),
        "propagation_p99_ms": p99,
        "diverged_nodes": sum(1 for g in final if g != generation),
        "push_timeouts": timeouts,
        "target_p99_ms": TARGET_P99_MS,
        "within_target": p99 is not None and p99 <= TARGET_P99_MS and timeouts == 0,
        "poll_ms": POLL_MS,
    }


async def _enforced_everywhere(health: list[str], generation: int) -> float | None:
    """When (loop time) the last node was first seen enforcing `generation`; None if some
    node had not within SETTLE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_S

    async def one(url: str) -> float | None:
        while loop.time() < deadline:
            if await _generation(url) >= generation:
                return loop.time()
            await asyncio.sleep(POLL_MS / 1000)
        return None

    seen = await asyncio.gather(*(one(url) for url in health))
    return None if any(s is None for s in seen) else max(s for s in seen if s is not None)


async def _generation(addr: str) -> int:
    """The generation of the bench's limit the node at `addr` (its telemetry endpoint)
    enforces now; 0 for none, or no answer within SETTLE_S."""
    try:
        body = await asyncio.wait_for(_get_health(addr), SETTLE_S)
    except (OSError, TimeoutError, ValueError):
        return 0
    for row in body.get("policies", {}).get("enforced", []):
        if (row.get("tenant"), row.get("metric")) == (LIMIT["tenant_id"], LIMIT["metric"]):
            return int(row.get("generation", 0))
    return 0


async def _get_health(addr: str) -> dict[str, Any]:
    """GET /health, asking the node to close after its answer (its HTTP server keeps a
    connection alive otherwise), so the body is what arrives before the close."""
    host, port = address_parts("addr", addr)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    out = json.loads(data.partition(b"\r\n\r\n")[2])
    if not isinstance(out, dict):
        raise ValueError("/health is not an object")
    return out


def _pct(ms: list[float], q: float) -> float | None:
    return round(percentile(ms, q), 3) if ms else None


if __name__ == "__main__":  # a quick look: python -m bench.policy
    t = time.perf_counter()
    print(run(nodes=4, pushes=20), f"{time.perf_counter() - t:.1f} s")

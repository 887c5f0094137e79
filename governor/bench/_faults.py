"""The scenarios that break things on purpose (a dead worker, a governord SIGKILLed under load)
and the overhead figures (in memory, SQLite, PostgreSQL), each through a real governord."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

from governor.client import Client, LeaseEnded
from governor.client._rpc import Dial, Rpc
from ratemesh.envelope import percentile

from ._daemon import KEYS, Governord

__all__ = ["dead_worker", "overhead", "restart"]

KEY_A, KEY_B = KEYS["BENCH_KEY_A"], KEYS["BENCH_KEY_B"]
DEFAULT_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres"

_WORKER = """
import asyncio, sys
from governor.client import Client
async def main(addr, key, ttl_ms, n):
    c = await Client(addr, key, ttl_ms=ttl_ms).connect()
    print("token", c._rpc.token, flush=True)
    for _ in range(n):
        print("lease", (await c.acquire_at(c.scope_id, "db")).lease_id, flush=True)
    print("ready", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


def _read_worker(proc: subprocess.Popen[str]) -> tuple[str, list[int]]:
    assert proc.stdout is not None
    token, leases = "", []
    while True:
        line = proc.stdout.readline().split()
        if not line:
            raise RuntimeError("the worker exited early")
        if line[0] == "token":
            token = line[1]
        elif line[0] == "lease":
            leases.append(int(line[1]))
        elif line[0] == "ready":
            return token, leases


async def dead_worker(p: dict[str, Any]) -> dict[str, Any]:
    """A worker holds the whole pool on a ``ttl_ms`` session and is SIGKILLed while another
    tenant waits. Measured: kill -> the waiter's grant; late releases by the dead worker."""
    loop = asyncio.get_running_loop()
    gov = Governord(
        "sqlite",
        root={"limits": {"db": p["pool"]}},
        session={"ttl_ms": p["ttl_ms"], "min_ttl_ms": 100},
    )
    await loop.run_in_executor(None, gov.start)
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, gov.addr, KEY_A, str(p["ttl_ms"]), str(p["pool"])],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        token, leases = await loop.run_in_executor(None, _read_worker, worker)
        async with Client(gov.addr, KEY_B, ttl_ms=30_000) as other:
            waiting = asyncio.create_task(other.acquire_at(other.scope_id, "db"))
            await asyncio.sleep(0.2)
            assert not waiting.done(), "the pool should be full"
            killed = time.monotonic()
            worker.kill()
            await waiting
            reclaim_ms = (time.monotonic() - killed) * 1000
        rpc = Rpc(Dial(gov.addr, KEY_A))
        rpc.token = token
        refused = 0
        for lease in leases:
            try:
                await rpc.call("Release", {"lease_id": lease})
            except LeaseEnded:
                refused += 1
        await rpc.close()
    finally:
        worker.kill()
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()
        gov.__exit__(None, None, None)
    return {
        "without": {
            "pool_usable_after_ms": None,
            "late_releases_refused": 0,
            "note": "a plain semaphore never gets a dead holder's slots back",
        },
        "with": {
            "pool_usable_after_ms": round(reclaim_ms),
            "ttl_ms": p["ttl_ms"],
            "within_ttl_plus_50ms": reclaim_ms <= p["ttl_ms"] + 50,
            "late_releases_refused": refused,
            "leases_held": len(leases),
        },
    }


async def restart(p: dict[str, Any]) -> dict[str, Any]:
    """``callers`` consume in a loop; governord is SIGKILLed and restarted. Measured: the
    longest gap between acknowledgements (downtime as callers see it) and whether every
    acknowledged charge is on record afterwards; the session and its lease must survive."""
    loop = asyncio.get_running_loop()
    gov = Governord("sqlite")
    await loop.run_in_executor(None, gov.start)
    try:
        async with Client(gov.addr, KEY_A, ttl_ms=p["ttl_ms"]) as client:
            async with client.task("load", quotas={"http": 10**12}) as task:
                lease = await client.acquire_at(task.node_id, "db")
                acked, gap, last = 0, 0.0, time.monotonic()
                stop = asyncio.Event()

                async def caller() -> None:
                    nonlocal acked, gap, last
                    while not stop.is_set():
                        await client.consume_at(task.node_id, "http", 1)
                        now = time.monotonic()
                        gap, last = max(gap, now - last), now
                        acked += 1

                callers = [asyncio.create_task(caller()) for _ in range(p["callers"])]
                await asyncio.sleep(p["before_s"])
                acked_before = acked

                def bounce() -> None:
                    gov.kill()
                    gov.start()

                await loop.run_in_executor(None, bounce)
                await asyncio.sleep(p["after_s"])
                stop.set()
                await asyncio.gather(*callers)
                on_record = (await client.get_node(task.node_id))["used"].get("http", 0)
                lease_live = await client.validate(lease.lease_id)
                await client.release(lease)
                session_kept = client.lost is None
    finally:
        gov.__exit__(None, None, None)
    return {
        "without": {
            "acked_charges": acked_before,
            "on_record_after_restart": 0,
            "note": "an in-process limiter's counters die with the process",
        },
        "with": {
            "downtime_ms": round(gap * 1000),
            "acked_charges": acked,
            "on_record": on_record,
            "every_ack_on_record": on_record == acked,
            "session_kept": session_kept,
            "lease_kept": lease_live,
        },
    }


async def _overhead_one(addr: str, p: dict[str, Any]) -> dict[str, Any]:
    async with Client(addr, KEY_A) as client:
        async with client.task("overhead", quotas={"http": 10**12}) as task:
            node = task.node_id
            for _ in range(20):
                await client.consume_at(node, "http")
            lat = []
            for _ in range(p["latency_calls"]):
                t0 = time.perf_counter()
                await client.consume_at(node, "http")
                lat.append(time.perf_counter() - t0)
            ar = []
            for _ in range(p["latency_calls"] // 2):
                t0 = time.perf_counter()
                lease = await client.acquire_at(node, "db")
                await client.release(lease)
                ar.append(time.perf_counter() - t0)
            count = 0
            stop = asyncio.Event()

            async def caller() -> None:
                nonlocal count
                while not stop.is_set():
                    await client.consume_at(node, "http")
                    count += 1

            callers = [asyncio.create_task(caller()) for _ in range(p["callers"])]
            t0 = time.perf_counter()
            await asyncio.sleep(p["throughput_s"])
            stop.set()
            await asyncio.gather(*callers)
            elapsed = time.perf_counter() - t0
    return {
        "consume_ms": round(statistics.fmean(lat) * 1000, 3),
        "consume_p50_ms": round(percentile(lat, 0.50) * 1000, 3),
        "acquire_release_ms": round(statistics.fmean(ar) * 1000, 3),
        f"consume_per_s_{p['callers']}_callers": round(count / elapsed),
    }


async def overhead(p: dict[str, Any], dsn: str | None) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    out: dict[str, Any] = {}
    for store in ("memory", "sqlite", "postgres"):
        if store == "postgres":
            dsn = dsn or DEFAULT_DSN
            try:
                import psycopg

                psycopg.connect(dsn, connect_timeout=3).close()
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                out[store] = {"skipped": f"PostgreSQL not reachable: {exc}"}
                continue
        gov = Governord(store, dsn=dsn)
        await loop.run_in_executor(None, gov.start)
        try:
            out[store] = await _overhead_one(gov.addr, p)
        finally:
            gov.__exit__(None, None, None)
    return {
        "without": {"consume_ms": 0.0, "note": "no governor: no call before the work"},
        "with": out,
    }

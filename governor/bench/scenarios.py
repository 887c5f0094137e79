"""``governord bench scenarios``: the seed's workloads without and with governord, against a
simulated downstream (``_downstream.py``), then broken on purpose.

Every "with" run goes through a real governord process (SQLite unless said otherwise) over gRPC
on loopback, through the SDK. The downstream is simulated, so the figures show how governord
behaves, not how a production system performs. Counts are stable between runs; timings are not.
The seed's own parameters are not in its text (its benchmark tables are figures), so the ones
used here are printed under ``params`` next to each result.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

from governor.client import Client, Denied, Group, consume, retry

from ._daemon import KEYS, Governord
from ._downstream import Downstream, DownstreamDown
from ._faults import dead_worker, overhead, restart

__all__ = ["SCENARIOS", "run"]

KEY_A, KEY_B = KEYS["BENCH_KEY_A"], KEYS["BENCH_KEY_B"]


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, int(0.95 * len(ordered) + 0.999) - 1)]


# ---- runaway fan-out -------------------------------------------------------------------------


async def _fanout(addr: str | None, p: dict[str, Any]) -> dict[str, Any]:
    """Each agent sends ``requests_per_agent`` requests, then spawns ``branching`` children,
    down to ``depth``. With governord: the run's task has an ``http`` quota and an ``agents``
    limit; an agent told no stops (and spawns nothing)."""
    ds = Downstream(None, p["request_ms"])
    if addr is None:

        async def free_agent(level: int) -> None:
            for _ in range(p["requests_per_agent"]):
                await ds.call()
            if level < p["depth"]:
                await asyncio.gather(*(free_agent(level + 1) for _ in range(p["branching"])))

        await free_agent(0)
        return {"requests_sent": ds.sent, "shed": 0, "peak_concurrency": ds.peak}
    shed = 0
    async with Client(addr, KEY_A) as client:
        quotas = {"http": p["http_quota"]}
        async with client.task("runaway", quotas=quotas, limits={"agents": p["agents_limit"]}):
            root = contextvars.copy_context()
            async with Group("agents") as group:

                async def agent(level: int) -> None:
                    nonlocal shed
                    for _ in range(p["requests_per_agent"]):
                        try:
                            await consume("http")
                        except Denied:
                            shed += 1
                            return
                        await ds.call()
                    if level < p["depth"]:
                        for i in range(p["branching"]):  # siblings under the run, not nested
                            root.run(
                                group.spawn, f"agent-{level + 1}-{i}", lambda: agent(level + 1)
                            )

                group.spawn("agent-0", lambda: agent(0))
    return {"requests_sent": ds.sent, "shed": shed, "peak_concurrency": ds.peak}


# ---- noisy neighbour -------------------------------------------------------------------------


async def _noisy(addr: str | None, p: dict[str, Any]) -> dict[str, Any]:
    """Tenant A queues ``a_jobs`` at once on a pool of ``pool`` slots; tenant B sends ``b_jobs``
    spaced ``b_gap_ms`` apart just after. Each job holds a slot for ``hold_ms``. Without: one
    first-come-first-served semaphore; with: governord's weighted fair queue."""
    waits: dict[str, list[float]] = {"a": [], "b": []}

    async def job(tenant: str, take: Any) -> None:
        t0 = time.monotonic()
        async with take():
            waits[tenant].append((time.monotonic() - t0) * 1000)
            await asyncio.sleep(p["hold_ms"] / 1000)

    async def submit(take_a: Any, take_b: Any) -> None:
        jobs = [asyncio.create_task(job("a", take_a)) for _ in range(p["a_jobs"])]
        await asyncio.sleep(0.05)
        for _ in range(p["b_jobs"]):
            jobs.append(asyncio.create_task(job("b", take_b)))
            await asyncio.sleep(p["b_gap_ms"] / 1000)
        await asyncio.gather(*jobs)

    if addr is None:
        sem = asyncio.Semaphore(p["pool"])
        await submit(lambda: sem, lambda: sem)
    else:
        async with Client(addr, KEY_A) as a, Client(addr, KEY_B) as b:
            await submit(lambda: a.acquire("db"), lambda: b.acquire("db"))
    return {
        "tenant_b_p95_wait_ms": round(_p95(waits["b"]), 1),
        "tenant_a_p95_wait_ms": round(_p95(waits["a"]), 1),
        "tenant_b_jobs": len(waits["b"]),
    }


# ---- retry storm -----------------------------------------------------------------------------


async def _retry_storm(addr: str | None, p: dict[str, Any]) -> dict[str, Any]:
    """Three nested layers of three attempts each, the downstream fully down. With governord,
    each call is a task with a ``retry`` quota of ``retry_budget``; retries spend it."""
    ds = Downstream(down=True)
    layers, attempts = p["layers"], p["attempts"]

    async def plain(level: int) -> None:
        last: Exception | None = None
        for _ in range(attempts):
            try:
                if level == 1:
                    await ds.call()
                else:
                    await plain(level - 1)
                return
            except DownstreamDown as exc:
                last = exc
        assert last is not None
        raise last

    async def budgeted(level: int) -> None:
        inner = ds.call if level == 1 else (lambda: budgeted(level - 1))
        await retry(inner, attempts=attempts, retry_on=(DownstreamDown,))

    if addr is None:
        for _ in range(p["calls"]):
            try:
                await plain(layers)
            except DownstreamDown:
                pass
    else:
        async with Client(addr, KEY_A) as client:
            for i in range(p["calls"]):
                async with client.task(f"call-{i}", quotas={"retry": p["retry_budget"]}):
                    try:
                        await budgeted(layers)
                    except DownstreamDown:
                        pass
    return {"requests_per_call": round(ds.sent / p["calls"], 2), "requests": ds.sent}


# ---- capacity drop: fixed vs adaptive ----------------------------------------------------------


async def _capacity(addr: str, p: dict[str, Any]) -> dict[str, Any]:
    """``workers`` loop acquire -> request -> release (latency, overloaded on a 503) for
    ``duration_s``; the downstream's capacity falls from ``capacity_before`` to
    ``capacity_after`` at one third. Counts are of the last third."""
    ds = Downstream(p["capacity_before"], p["service_ms"], p["reject_ms"])
    stop = asyncio.Event()
    async with Client(addr, KEY_A) as client:

        async def worker() -> None:
            while not stop.is_set():
                async with client.acquire("db") as lease:
                    lease.overloaded = await ds.call() == 503

        start = time.monotonic()
        tasks = [asyncio.create_task(worker()) for _ in range(p["workers"])]
        third = p["duration_s"] / 3
        await asyncio.sleep(third)
        ds.capacity = p["capacity_after"]
        await asyncio.sleep(2 * third)
        stop.set()
        await asyncio.gather(*tasks)
    served, shed = ds.window(start + 2 * third, start + 3 * third)
    return {"shed_last_third": shed, "served_last_third": served}


async def _scenario_with_daemon(
    fn: Any, p: dict[str, Any], *, with_daemon: bool, **config: Any
) -> dict[str, Any]:
    if not with_daemon:
        result: dict[str, Any] = await fn(None, p)
        return result
    gov = Governord("sqlite", **config)
    await asyncio.get_running_loop().run_in_executor(None, gov.start)
    try:
        result = await fn(gov.addr, p)
        return result
    finally:
        gov.__exit__(None, None, None)


PARAMS: dict[str, dict[str, Any]] = {
    "fanout": {
        "branching": 4,
        "depth": 5,
        "requests_per_agent": 2,
        "request_ms": 5,
        "http_quota": 500,
        "agents_limit": 8,
    },
    "noisy_neighbour": {"pool": 4, "a_jobs": 400, "b_jobs": 20, "b_gap_ms": 20, "hold_ms": 10},
    "retry_storm": {"calls": 20, "layers": 3, "attempts": 3, "retry_budget": 1},
    "capacity_drop": {
        "workers": 30,
        "duration_s": 9.0,
        "capacity_before": 20,
        "capacity_after": 5,
        "service_ms": 20,
        "reject_ms": 5,
        "fixed_limit": 20,
        "adaptive": {
            "initial_limit": 20,
            "min_limit": 1,
            "max_limit": 30,
            "target_p95_ms": 100,
            "max_overload_permille": 100,
            "min_samples": 10,
            "interval_ms": 250,
        },
    },
    "dead_worker": {"ttl_ms": 1000, "pool": 4},
    "restart": {"callers": 16, "before_s": 1.5, "after_s": 1.5, "ttl_ms": 5000},
    "overhead": {"latency_calls": 300, "callers": 16, "throughput_s": 3.0},
}
QUICK: dict[str, dict[str, Any]] = {
    "fanout": {"depth": 3},
    "noisy_neighbour": {"a_jobs": 60, "b_jobs": 5},
    "retry_storm": {"calls": 3},
    "capacity_drop": {"duration_s": 1.5, "workers": 10},
    "restart": {"callers": 4, "before_s": 0.3, "after_s": 0.3},
    "overhead": {"latency_calls": 30, "throughput_s": 0.5},
}


async def _run(names: list[str], params: dict[str, dict[str, Any]], dsn: str | None) -> Any:
    out: dict[str, Any] = {}
    for name in names:
        p = params[name]
        if name == "fanout":
            out[name] = {
                "without": await _fanout(None, p),
                "with": await _scenario_with_daemon(_fanout, p, with_daemon=True),
            }
        elif name == "noisy_neighbour":
            root = {"root": {"limits": {"db": p["pool"]}}}
            out[name] = {
                "without": await _noisy(None, p),
                "with": await _scenario_with_daemon(_noisy, p, with_daemon=True, **root),
            }
        elif name == "retry_storm":
            out[name] = {
                "without": await _retry_storm(None, p),
                "with": await _scenario_with_daemon(_retry_storm, p, with_daemon=True),
            }
        elif name == "capacity_drop":
            fixed = {"root": {"limits": {"db": p["fixed_limit"]}}}
            adaptive = {"adaptive": {"db": p["adaptive"]}}
            out[name] = {
                "fixed": await _scenario_with_daemon(_capacity, p, with_daemon=True, **fixed),
                "adaptive": await _scenario_with_daemon(_capacity, p, with_daemon=True, **adaptive),
            }
        elif name == "dead_worker":
            out[name] = await dead_worker(p)
        elif name == "restart":
            out[name] = await restart(p)
        elif name == "overhead":
            out[name] = await overhead(p, dsn)
        out[name]["params"] = p
    return out


SCENARIOS = list(PARAMS)


def run(*, dsn: str | None = None, quick: bool = False, only: list[str] | None = None) -> Any:
    names = only or SCENARIOS
    unknown = [n for n in names if n not in PARAMS]
    if unknown:
        raise SystemExit(f"governord bench scenarios: unknown scenario(s) {unknown}")
    params = {k: dict(v) for k, v in PARAMS.items()}
    if quick:
        for k, v in QUICK.items():
            params[k].update(v)
    started = time.monotonic()
    result = asyncio.run(_run(names, params, dsn))
    result["seconds"] = round(time.monotonic() - started, 1)
    result["quick"] = quick
    return result

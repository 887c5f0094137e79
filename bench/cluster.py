"""`mesh bench cluster`: a real cluster of worker processes on loopback.

Each worker process embeds `Mesh` (gRPC, static membership) and offers load from its own
event loop: a hot tenant over its limit, and background traffic over many tenants (one
key each, under the `*` default policy). All workers offer during the same wall-clock
window; the parent pools what they recorded:

* the report-to-acknowledgement delay, p50/p99 over every acknowledged report, and d from
  them (`ratemesh.envelope.d_estimate_ns`: the p99 plus one sync interval);
* excess: the largest lead of the hot tenant's fleet-wide admissions, over any window, on
  what an exact limiter could admit in it (B + R*window), beside the bound N*b + R*d;
* peer messages per worker per second, at 1x and 10x the request rate;
* hot-path ops/s: `Mesh.try_admit` calls per second in timed bursts (2,000 calls about
  every 100 ms, on a never-limited tenant) while the node runs and traffic flows.

`python -m bench.cluster worker ...` is one worker (the node tests use it too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench._procs import (
    HOT,
    cluster_config,
    free_port,
    go,
    print_result,
    read_ready,
    spawn,
    stop,
    watchdog,
    write_config,
)
from mesh.core.config import CoreConfig
from mesh.telemetry import excess_over_windows as _excess
from ratemesh.envelope import d_estimate_ns, excess_bound, percentiles

__all__ = ["run", "run_window", "excess_over_windows", "read_buckets", "BUCKET_S"]

BUCKET_S = 0.01
SYNC_INTERVAL_NS = CoreConfig().sync_interval_ns  # the workers' (`cluster_config`: defaults)
D_HORIZON_NS = CoreConfig().owner_unreachable_ns  # and d's horizon (`d_estimate_ns`)
PROBE_CALLS = 2000  # hot-path calls per timed burst (tenant "probe", never limited)


def excess_over_windows(buckets: list[int], rate: float, burst: int) -> float:
    return _excess(buckets, rate, burst, BUCKET_S)


def run_window(procs_args: list[list[str]]) -> list[dict[str, Any]]:
    """Start workers, start their window together once all serve, return their results."""
    procs = [spawn(a) for a in procs_args]
    try:
        for p in procs:
            read_ready(p)
        go(procs)
        results = [read_ready(p, timeout_s=120) for p in procs]
    finally:
        for p in procs:
            stop(p)
    return results


def run(
    *,
    workers: int = 4,
    seconds: float = 5.0,
    keys: int = 10_000,
    hot_factor: float = 4.0,
    key_rate: float = 4000.0,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "workers": workers,
        "seconds": seconds,
        "keys": keys,
        "sync_interval_ms": SYNC_INTERVAL_NS // 1_000_000,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for mult in (1, 10):
            results = _one_run(
                Path(tmp),
                workers,
                seconds,
                keys,
                hot_rate=HOT["target_rate"] * hot_factor * mult,
                key_rate=key_rate * mult,
            )
            msgs = sum(r["messages_sent"] for r in results) / workers / seconds
            out[f"messages_per_worker_s_{mult}x"] = round(msgs, 1)
            if mult == 1:
                out.update(_summary(results, workers, seconds))
    return out


def _one_run(
    tmp: Path, workers: int, seconds: float, keys: int, *, hot_rate: float, key_rate: float
) -> list[dict[str, Any]]:
    ids = [f"w{i}" for i in range(workers)]
    members = {m: f"127.0.0.1:{free_port()}" for m in ids}
    cfg = write_config(tmp / "cluster.yaml", cluster_config(members))
    return run_window(
        [
            worker_args(
                cfg,
                m,
                seconds,
                hot_rate / workers,
                "--key-rate",
                str(key_rate / workers),
                "--keys",
                str(keys),
                "--probe",
            )
            for m in ids
        ]
    )


def worker_args(cfg: Path, member: str, seconds: float, hot_rate: float, *extra: str) -> list[str]:
    """The arguments (after the interpreter) of one `bench.cluster worker` process, which
    waits for `go` and then offers `hot_rate`/s of the hot key for `seconds`."""
    return [
        "-m", "bench.cluster", "worker", "--config", str(cfg), "--member-id", member,
        "--start-at", "0", "--seconds", str(seconds), "--hot-rate", str(hot_rate), *extra,
    ]  # fmt: skip


def _summary(results: list[dict[str, Any]], workers: int, seconds: float) -> dict[str, Any]:
    n_buckets = max(len(r["hot_buckets"]) for r in results)
    buckets = [
        sum(r["hot_buckets"][i] for r in results if i < len(r["hot_buckets"]))
        for i in range(n_buckets)
    ]
    delays = [d for r in results for d in r["delays_ns"]]
    p50, p99 = percentiles(delays, 0.50, 0.99) if delays else (0, 0)
    d_ns = d_estimate_ns(delays, SYNC_INTERVAL_NS, horizon_ns=D_HORIZON_NS)
    rate, burst, b = HOT["target_rate"], HOT["global_burst"], HOT["local_burst_cap"]
    admitted = sum(buckets)
    ideal = min(sum(r["hot_offered"] for r in results), int(burst + rate * seconds))
    excess = excess_over_windows(buckets, rate, burst)
    bound = excess_bound(workers, b, rate, d_ns)
    calls = sum(r["hot_calls"] for r in results)
    spent = sum(r["hot_ns"] for r in results)
    return {
        "d_p50_ms": round(p50 / 1e6, 3),
        "d_p99_ms": round(p99 / 1e6, 3),  # of the delays; d (the bound's) adds a sync interval
        "d_ms": round(d_ns / 1e6, 3),
        "admitted": admitted,
        "ideal": ideal,
        "excess": round(excess, 1),
        "bound": round(bound, 1),
        "within_bound": excess <= bound,
        "hotpath_ops_per_s": round(calls / (spent / 1e9)) if spent else 0,
        "delay_samples": len(delays),
        "tick_lag_max_ms": max(r.get("tick_lag_max_ms", 0.0) for r in results),
    }


# -- one worker process -------------------------------------------------------------------


async def _worker(a: argparse.Namespace) -> dict[str, Any]:
    from dataclasses import replace

    from mesh.config import load_config
    from mesh.node import Mesh

    cfg = replace(load_config(a.config), member_id=a.member_id)
    if a.listen:
        cfg = replace(cfg, listen=a.listen)
    elif cfg.membership and cfg.membership.source == "static":
        cfg = replace(cfg, listen=cfg.membership.members[a.member_id])
    async with Mesh(cfg) as mesh:
        driver = mesh._require()
        driver.recent_delays_ns = deque(maxlen=1_000_000)
        print(json.dumps({"member_id": mesh.member_id, "address": mesh.address}), flush=True)
        if not a.start_at:  # the parent says when, once every worker serves
            line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            a.start_at = float(line)
        while time.time() < a.start_at:
            await asyncio.sleep(0.005)
        driver.recent_delays_ns.clear()
        sent0 = driver.messages_sent
        driver.tick_lag_max_s = 0.0
        res = await _offer(mesh, a)
        res["messages_sent"] = driver.messages_sent - sent0
        res["tick_lag_max_ms"] = round(driver.tick_lag_max_s * 1000, 1)
        res["delays_ns"] = list(driver.recent_delays_ns)
        res["health"] = {"membership": mesh.health()["membership"]}
        await asyncio.sleep(0.3)  # let the others finish their window before we leave
    return res


async def _offer(mesh: Any, a: argparse.Namespace) -> dict[str, Any]:
    tenants = [f"k{i}" for i in range(a.keys)]
    n_buckets = int(a.seconds / BUCKET_S) + 1
    buckets = [0] * n_buckets
    shared = _SharedBuckets(a.buckets_file, n_buckets) if a.buckets_file else None
    offered = calls = spent = 0
    carry_hot = carry_keys = 0.0
    ki = 0
    step = 0
    probe_every = 100 if a.probe else 0  # about every 100 ms
    last = time.time()
    end = a.start_at + a.seconds
    try_admit = mesh.try_admit
    perf = time.perf_counter_ns
    while True:
        now = time.time()
        if now >= end:
            break
        dt, last = now - last, now
        carry_hot += a.hot_rate * dt
        carry_keys += a.key_rate * dt
        n_hot, n_keys = int(carry_hot), int(carry_keys)
        carry_hot -= n_hot
        carry_keys -= n_keys
        idx = min(int((now - a.start_at) / BUCKET_S), n_buckets - 1)
        ok = 0
        for _ in range(n_hot):
            ok += try_admit("hot", "read_iops").allowed
        for _ in range(n_keys):
            try_admit(tenants[ki], "read_iops")
            ki = ki + 1 if ki + 1 < a.keys else 0
        buckets[idx] += ok
        if probe_every and step % probe_every == 0:  # a timed burst of pure hot-path calls
            t0 = perf()
            for _ in range(PROBE_CALLS):
                try_admit("probe", "read_iops")
            spent += perf() - t0
            calls += PROBE_CALLS
        step += 1
        offered += n_hot
        if shared is not None and ok:
            shared.add(idx, ok)
        await asyncio.sleep(0.001)
    return {"hot_buckets": buckets, "hot_offered": offered, "hot_calls": calls, "hot_ns": spent}


class _SharedBuckets:
    """Admissions per bucket in a memory-mapped file: what a SIGKILLed worker admitted
    before it died is still there for the checker to read."""

    def __init__(self, path: str, n: int) -> None:
        import mmap

        with open(path, "wb") as f:
            f.write(b"\0" * 8 * n)
        self._f = open(path, "r+b")  # noqa: SIM115 - kept open for the process's life
        self.map = mmap.mmap(self._f.fileno(), 8 * n)

    def add(self, idx: int, n: int) -> None:
        import struct

        old = struct.unpack_from("<q", self.map, 8 * idx)[0]
        struct.pack_into("<q", self.map, 8 * idx, old + n)


def read_buckets(path: str) -> list[int]:
    import struct
    from pathlib import Path as _P

    data = _P(path).read_bytes()
    return list(struct.unpack(f"<{len(data) // 8}q", data))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--config", required=True)
    w.add_argument("--member-id", required=True)
    w.add_argument(
        "--start-at",
        type=float,
        default=0.0,
        help="wall-clock start of the window (0: read it from stdin when ready)",
    )
    w.add_argument("--seconds", type=float, required=True)
    w.add_argument("--hot-rate", type=float, required=True)
    w.add_argument("--key-rate", type=float, default=0.0)
    w.add_argument("--keys", type=int, default=1)
    w.add_argument("--probe", action="store_true", help="time bursts of try_admit")
    w.add_argument("--listen", help="peer address (default: this member's static address)")
    w.add_argument("--buckets-file", help="also count admissions here (survives SIGKILL)")
    a = p.parse_args(argv)
    from mesh.node import new_event_loop, tune_gc

    tune_gc()
    loop = new_event_loop()
    watchdog(loop, a.seconds + 45)  # the parent waits seconds + 60 for the result
    try:
        res = loop.run_until_complete(_worker(a))
    finally:
        loop.close()
    print_result(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

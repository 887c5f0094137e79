"""`mesh bench strict --sweep`: strict mode's utilisation and envelope over burst-to-rate
ratio, fleet size and the one-way delay to governord (DESIGN.md section 5).

Each row is a fresh fleet: `workers` new nodes (bench.strict_worker, the same workers as
`mesh bench strict`) that ask for tenant load's strict limit at `offered_x` x R in total,
spread evenly over their threads, for `seconds`. They spend at a governord tenant rated
R = RATE per second with burst B = R x `b_over_r_s`, one tenant per B/R value (the key in a
node's config picks it), and a row on a bucket a row before it used starts once B/R has
passed since, so it finds the bucket full. The worker processes and governord (SQLite) live
the whole sweep, so a row pays neither a fleet's imports nor a governord's start. With
`delay_ms` > 0 every node reaches governord through one `DelayProxy` that holds each chunk
`delay_ms` in each direction, in order. The nodes' `strict:` section has no `credit:` key
unless one is given, so a row shows what the defaults serve. There is no kill: `mesh bench
strict` shows the outage.

Per row: `utilisation` = admitted / (R x seconds + B), the first reserve's wait included;
`max_excess` over every interval of the workers' own admission instants against R and B
(`bench.strict.max_excess`, the one envelope computation of both benches); `first_admit_ms`
from the start to the fleet's first admission; `governord_rtt_ms`, the least of a few gRPC
round trips from the bench to governord through the same path as the workers (the proxy
included), timed after the load so it does not compete with it; `proxy_connections` and
`proxy_bytes`, what the proxy carried.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench._procs import free_port, go, read_ready
from bench.strict import (
    START_TIMEOUT_S,
    Governord,
    governor_calls,
    load_policy,
    max_excess,
    rated,
    reap,
    spawn_server,
    worker_config,
)
from governor.testing.faults import DelayProxy

__all__ = [
    "B_OVER_R_MAX_S",
    "B_OVER_R_S",
    "DELAY_MS",
    "DELAY_MS_MAX",
    "RATE",
    "ROWS_MAX",
    "WORKERS",
    "run",
    "table",
    "target_utilisation",
]

RATE = 1_000  # R per second on tenant load's node, every row
B_OVER_R_S = (0.05, 0.1, 0.5, 2.0)  # B / R: the bucket refills in this long
B_OVER_R_MAX_S = 60.0
WORKERS = (4, 8)
DELAY_MS = (0, 5, 20, 50)  # one way, each direction, between every worker and governord
SECONDS = 3.0  # per row
OFFERED_X = 3.0
THREADS = 4  # asking threads per worker
DELAY_MS_MAX = 1_000  # a longer one-way delay is not a link this sweep is about
ROWS_MAX = 256  # rows one sweep may run (the product of the three lists)
RTT_PROBES = 5  # gRPC round trips timed per row; the least is reported
RTT_TIMEOUT_S = 10.0
RESULT_SLACK_S = 60.0  # past the row's seconds, for a worker's result
ROW_SLACK_S = 120.0  # per row, past its seconds, before a worker's watchdog fires
KEY_ENV_PREFIX = "RATEMESH_BENCH_SWEEP_KEY_"  # + the B/R's index: its governord tenant's key
STOP_TIMEOUT_S = 10.0  # a worker told to end (EOF) has this long before it is killed
NS = 1_000_000_000
# the targets with default settings: 0.9 of R*S + B with no added delay, 0.8 up to
# 20 ms one way; none stated beyond
TARGET_UTILISATION = ((0, 0.9), (20, 0.8))


def target_utilisation(delay_ms: float) -> float | None:
    """The utilisation a row at `delay_ms` one way is held to, or None past every target."""
    for upto_ms, target in TARGET_UTILISATION:
        if delay_ms <= upto_ms:
            return target
    return None


def run(
    *,
    b_over_r_s: Sequence[float] = B_OVER_R_S,
    workers: Sequence[int] = WORKERS,
    delay_ms: Sequence[float] = DELAY_MS,
    seconds: float = SECONDS,
    threads: int = THREADS,
    offered_x: float = OFFERED_X,
    credit: dict[str, int] | None = None,
    mode: str = "strict",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every row of b_over_r_s x workers x delay_ms, in that order; the rows and the run's
    settings and machine load."""
    combos = [(b, n, d) for b in b_over_r_s for n in workers for d in delay_ms]
    if not 0 < len(combos) <= ROWS_MAX:
        raise ValueError(f"a sweep runs 1 to {ROWS_MAX} rows, got {len(combos)}")
    load_policy(mode, RATE, RATE)  # a bad mode, before anything starts
    load_before = os.getloadavg()
    started = time.monotonic()
    # one governord tenant per B/R (its key picks it), so one governord serves the sweep
    bursts = {b: max(1, round(RATE * b)) for b in b_over_r_s}
    key_envs = {b: f"{KEY_ENV_PREFIX}{i}" for i, b in enumerate(bursts)}
    keys = {key_envs[b]: secrets.token_hex(16) for b in bursts}
    tenants = {f"b{i}": rated(key_envs[b], RATE, bursts[b]) for i, b in enumerate(bursts)}
    watchdog_s = len(combos) * (seconds + ROW_SLACK_S)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ratemesh-bench-sweep-") as name:
        tmp = Path(name)
        gov = Governord(tmp, keys, tenants)
        pool: list[subprocess.Popen[str]] = []
        full_at: dict[float, float] = {}  # per B/R: when its bucket is full again
        try:
            # worker processes live the whole sweep (each row starts new nodes in them), and
            # one governord: a row costs neither a fleet's imports nor a governord's start
            for i in range(max(workers)):
                pool.append(spawn_server(tmp / f"w{i}.stderr", keys, watchdog_s))
            gov.start()
            for p in pool:
                read_ready(p, START_TIMEOUT_S)
            for i, (b, n, d) in enumerate(combos, 1):
                t0 = time.monotonic()
                row_dir = tmp / f"row{i}"
                row_dir.mkdir()
                row = _row(
                    pool[:n], row_dir, gov.addr, key_envs[b], bursts[b], b, d,
                    not_before=full_at.get(b, 0.0), seconds=seconds, threads=threads,
                    offered_x=offered_x, credit=credit, mode=mode,
                )  # fmt: skip
                # the nodes returned what they held when they stopped: B/R refills the rest
                full_at[b] = time.time() + b
                rows.append(row)
                if progress is not None:
                    progress(
                        f"row {i}/{len(combos)}: B/R {b:g} s, {n} workers, {d:g} ms one way: "
                        f"utilisation {row['utilisation']}, max_excess {row['max_excess']}, "
                        f"rtt {row['governord_rtt_ms']} ms ({time.monotonic() - t0:.1f} s)"
                    )
        finally:
            _close_pool(pool)
            gov.close()
    return {
        "rows": rows,
        "mode": mode,
        "rate": RATE,
        "seconds": seconds,
        "threads": threads,
        "offered_x": offered_x,
        "credit": credit if credit is not None else "defaults",
        "max_excess": max(r["max_excess"] for r in rows),
        "utilisation_min": min(r["utilisation"] for r in rows),
        "within_targets": all(r["within_target"] for r in rows),
        "took_s": round(time.monotonic() - started, 1),
        "cpus": os.cpu_count(),
        "load_avg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }


def _row(
    pool: list[subprocess.Popen[str]],
    tmp: Path,
    governord: str,
    key_env: str,
    burst: int,
    b_over_r_s: float,
    delay_ms: float,
    *,
    not_before: float,
    seconds: float,
    threads: int,
    offered_x: float,
    credit: dict[str, int] | None,
    mode: str,
) -> dict[str, Any]:
    """One row on the first len(pool) worker processes: fresh nodes spending at the tenant
    whose key is in `key_env`, started no earlier than `not_before` (time.time())."""
    workers = len(pool)
    policy = load_policy(mode, RATE, burst)
    proxy: DelayProxy | None = None
    try:
        target = governord
        if delay_ms > 0:
            proxy = DelayProxy(governord).start()
            proxy.set_delay_ms(delay_ms)
            target = proxy.address
        members = {f"w{i}": f"127.0.0.1:{free_port()}" for i in range(workers)}
        per_thread = offered_x * RATE / (workers * threads)
        for m, p in zip(members, pool, strict=True):
            cfg = worker_config(
                tmp, m, members, policy, governord=target, credit=credit, key_env=key_env
            )
            job = {"config": str(cfg), "threads": threads, "rate": per_thread, "seconds": seconds}
            assert p.stdin is not None
            p.stdin.write(json.dumps(job) + "\n")
            p.stdin.flush()
        for p in pool:
            read_ready(p, START_TIMEOUT_S)
        time.sleep(max(0.0, not_before - time.time()))
        start_ns = int(go(pool) * NS)
        results = [read_ready(p, seconds + RESULT_SLACK_S) for p in pool]
        rtt_ms = _round_trip_ms(target)
        stats = proxy.stats() if proxy is not None else None
    finally:
        if proxy is not None:
            proxy.close()
    row = _figures(results, b_over_r_s, workers, delay_ms, burst, seconds, start_ns, rtt_ms)
    # what went through the proxy: the nodes' connections and the probe's one, both ways
    row["proxy_connections"] = stats.connections_accepted if stats is not None else 0
    row["proxy_bytes"] = stats.bytes_forwarded if stats is not None else 0
    return row


def _close_pool(pool: list[subprocess.Popen[str]]) -> None:
    """EOF on each worker's stdin ends it; one that does not end in time is killed."""
    for p in pool:
        if p.stdin is not None:
            with contextlib.suppress(OSError):
                p.stdin.close()
    for p in pool:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(STOP_TIMEOUT_S)
        reap(p)


def _figures(
    results: list[dict[str, Any]],
    b_over_r_s: float,
    workers: int,
    delay_ms: float,
    burst: int,
    seconds: float,
    start_ns: int,
    rtt_ms: float,
) -> dict[str, Any]:
    times = sorted(t for r in results for t in r["admitted_ns"])
    excess = max_excess(times, RATE, burst)
    utilisation = len(times) / (RATE * seconds + burst)
    per_worker = [len(r["admitted_ns"]) for r in results]
    calls = governor_calls(results)
    offered = sum(int(r["offered"]) for r in results)
    denied: Counter[str] = Counter()
    for r in results:
        denied.update(r.get("denied", {}))
    target = target_utilisation(delay_ms)
    return {
        "b_over_r_s": b_over_r_s,
        "workers": workers,
        "delay_ms": int(delay_ms) if delay_ms == int(delay_ms) else delay_ms,
        "utilisation": round(utilisation, 4),
        "max_excess": round(excess, 3),
        "rate": RATE,
        "burst": burst,
        "seconds": seconds,
        "offered": offered,
        "offered_x_rate": round(offered / (RATE * seconds), 2),  # the asks the threads made
        "admitted": len(times),
        "first_admit_ms": round((times[0] - start_ns) / 1e6, 1) if times else None,
        "governord_rtt_ms": rtt_ms,
        "governor_calls_per_admitted": round(calls / max(1, len(times)), 4),
        "per_worker_admitted": per_worker,
        "denied": dict(sorted(denied.items())),
        "target_utilisation": target,
        "within_target": excess <= 0 and (target is None or utilisation >= target),
    }


def table(result: dict[str, Any]) -> str:
    """The rows as a table for a person: one line each."""
    head = "B/R s  workers  delay ms  rtt ms  utilisation  max_excess  first ms  calls/adm"
    lines = [head]
    for r in result["rows"]:
        lines.append(
            f"{r['b_over_r_s']:>5g}  {r['workers']:>7}  {r['delay_ms']:>8g}  "
            f"{r['governord_rtt_ms']:>6}  {r['utilisation']:>11}  {r['max_excess']:>10}  "
            f"{r['first_admit_ms']!s:>8}  {r['governor_calls_per_admitted']:>9}"
        )
    lines.append(
        f"credit {result['credit']}, R {result['rate']}/s, {result['offered_x']} x R offered, "
        f"{result['seconds']} s a row; within targets: {result['within_targets']}"
    )
    return "\n".join(lines)


def _round_trip_ms(target: str) -> float:
    """The least of RTT_PROBES gRPC round trips to governord at `target`, in ms: a call of a
    method it does not serve, which its server answers (UNIMPLEMENTED) without touching any
    state, once the channel is up."""
    import grpc

    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=RTT_TIMEOUT_S)
        probe = channel.unary_unary("/ratemesh.bench.Probe/RoundTrip")
        best = math.inf
        for _ in range(RTT_PROBES):
            t0 = time.perf_counter()
            with contextlib.suppress(grpc.RpcError):
                probe(b"", timeout=RTT_TIMEOUT_S)
            best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 2)


if __name__ == "__main__":  # a quick look: python -m bench.strict_sweep
    print(run(b_over_r_s=[0.1], workers=[4], delay_ms=[0, 20], seconds=2.0))

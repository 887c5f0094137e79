"""`mesh bench strict --sweep`: strict mode's utilisation and envelope over burst-to-rate
ratio, fleet size and the one-way delay to governord (DESIGN.md section 5).

Each row is a fresh fleet: governord on SQLite rating tenant load's node at R = RATE per
second with burst B = R x `b_over_r_s`; `workers` processes (bench.strict_worker, the same
workers as `mesh bench strict`) ask for the strict limit at `offered_x` x R in total, spread
evenly over their threads, for `seconds`. With `delay_ms` > 0 every worker reaches governord
through one `DelayProxy` that holds each chunk `delay_ms` in each direction, in order. The
workers' `strict:` section has no `credit:` key unless one is given, so a row shows what the
defaults serve. There is no kill: `mesh bench strict` shows the outage.

Per row: `utilisation` = admitted / (R x seconds + B), the first reserve's wait included;
`max_excess` over every interval of the workers' own admission instants against R and B
(`bench.strict.max_excess`, the one envelope computation of both benches); `first_admit_ms`
from the start to the fleet's first admission; `governord_rtt_ms`, the least of a few gRPC
round trips from the bench to governord through the same path as the workers (the proxy
included), timed after the load so it does not compete with it.
"""

from __future__ import annotations

import contextlib
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
    FAST_KEY_ENV,
    LOAD_KEY_ENV,
    START_TIMEOUT_S,
    Governord,
    governor_calls,
    load_policy,
    max_excess,
    reap,
    spawn_worker,
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
    load_before = os.getloadavg()
    started = time.monotonic()
    rows = []
    for i, (b, n, d) in enumerate(combos, 1):
        t0 = time.monotonic()
        row = _row(
            b, n, d, seconds=seconds, threads=threads, offered_x=offered_x, credit=credit, mode=mode
        )
        rows.append(row)
        if progress is not None:
            progress(
                f"row {i}/{len(combos)}: B/R {b:g} s, {n} workers, {d:g} ms one way: "
                f"utilisation {row['utilisation']}, max_excess {row['max_excess']}, "
                f"rtt {row['governord_rtt_ms']} ms ({time.monotonic() - t0:.1f} s)"
            )
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
    b_over_r_s: float,
    workers: int,
    delay_ms: float,
    *,
    seconds: float,
    threads: int,
    offered_x: float,
    credit: dict[str, int] | None,
    mode: str,
) -> dict[str, Any]:
    burst = max(1, round(RATE * b_over_r_s))
    policy = load_policy(mode, RATE, burst)
    keys = {LOAD_KEY_ENV: secrets.token_hex(16), FAST_KEY_ENV: secrets.token_hex(16)}
    with tempfile.TemporaryDirectory(prefix="ratemesh-bench-sweep-") as name:
        tmp = Path(name)
        gov = Governord(tmp, keys, rate=RATE, burst=burst)
        proxy: DelayProxy | None = None
        procs: list[subprocess.Popen[str]] = []
        try:
            gov.start()
            target = gov.addr
            if delay_ms > 0:
                proxy = DelayProxy(gov.addr).start()
                proxy.set_delay_ms(delay_ms)
                target = proxy.address
            members = {f"w{i}": f"127.0.0.1:{free_port()}" for i in range(workers)}
            per_thread = offered_x * RATE / (workers * threads)
            for m in members:
                cfg = worker_config(tmp, m, members, policy, governord=target, credit=credit)
                procs.append(spawn_worker(cfg, keys, threads, per_thread, seconds))
            for p in procs:
                read_ready(p, START_TIMEOUT_S)
            start_ns = int(go(procs) * NS)
            results = [read_ready(p, seconds + RESULT_SLACK_S) for p in procs]
            rtt_ms = _round_trip_ms(target)
        finally:
            for p in procs:
                reap(p)
            if proxy is not None:
                proxy.close()
            gov.close()
    return _figures(results, b_over_r_s, workers, delay_ms, burst, seconds, start_ns, rtt_ms)


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
        "offered": sum(int(r["offered"]) for r in results),
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

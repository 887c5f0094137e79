"""One worker of `mesh bench redis` (bench.redis): a threaded Mesh whose one redis-mode
limit it asks at a paced rate, recording every decision's instant, latency and kind.

Protocol with the bench: print {"ready": true}; read the start instant (seconds, a line,
bench._procs.go) and then the end instant (ns, a line); ask from start to end; print the
result (bench._procs.print_result).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench._procs import print_result
from bench.redis import CODES, NS
from mesh.core.verdict import Step, Suspension, Verdict


def _code(v: Verdict) -> int:
    if v.step is Step.REDIS and v.suspended is None:
        return CODES["redis_ok"] if v.allowed else CODES["redis_no"]
    if v.suspended is Suspension.REDIS_UNREACHABLE and v.step is not Step.REDIS:
        return CODES["local_ok"] if v.allowed else CODES["local_no"]
    return CODES["undisclosed"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.redis_worker")
    p.add_argument("--addr", required=True)
    p.add_argument("--tenant", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--rate", type=int, required=True)
    p.add_argument("--burst", type=int, required=True)
    p.add_argument("--offer", type=int, required=True)
    args = p.parse_args(argv)
    from mesh.node import Mesh

    policy = {
        "tenant_id": args.tenant,
        "metric": "read_iops",
        "generation": 1,
        "target_rate": args.rate,
        "global_burst": args.burst,
        "local_burst_cap": 1,
        "mode": "redis",
    }
    cfg = {
        "member_id": f"{args.tenant}-w{args.index}",
        "listen": "127.0.0.1:0",
        "shutdown_drain_ms": 100,
        "policies": {"inline": [policy]},
        "shared_state": {"redis": {"external": "allow", "addr": args.addr}},
    }
    mesh = Mesh(cfg).start()
    print('{"ready": true}', flush=True)
    start_at = float(sys.stdin.readline())
    end_ns = int(sys.stdin.readline())
    at: list[int] = []
    took: list[int] = []
    codes: list[int] = []
    gap_ns = NS // args.offer
    try:
        delay = start_at - time.time()
        if delay > 0:
            time.sleep(delay)
        clock, wall = time.perf_counter_ns, time.time_ns
        next_ns = wall()
        while True:
            now = wall()
            if now >= end_ns:
                break
            if now < next_ns:
                time.sleep((next_ns - now) / NS)
                continue
            next_ns += gap_ns
            t0 = clock()
            v = mesh.try_admit(args.tenant, "read_iops")
            t1 = clock()
            at.append(now)
            took.append(t1 - t0)
            codes.append(_code(v))
        health: dict[str, Any] = mesh.health()["redis"]
    finally:
        mesh.stop()
    print_result({"at_ns": at, "took_ns": took, "codes": codes, "health": health})
    return 0


if __name__ == "__main__":
    sys.exit(main())

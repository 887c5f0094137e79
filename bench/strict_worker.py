"""One worker of `mesh bench strict`: a threaded `mesh.node.Mesh` whose threads ask for a
strict limit at a steady pace and record the wall-clock instant (time.time_ns) of every
admission.

    python -m bench.strict_worker --config node.yaml --threads 4 --rate 500 --seconds 10

Prints `{"ready": ...}` once the node runs, reads the start instant (time.time() seconds) on
stdin (bench._procs.go), asks from then for --seconds, then prints its result (through a
file, bench._procs.print_result): `admitted_ns` (sorted), `offered`, `strict` (the node's
/health strict counters). With --ops-seconds > 0 it then times tight try_admit loops on a
second node of its own (`--ops-config`): a strict limit with plenty of credit against a
global limit, alternated, and adds `strict_ops_per_s` and `global_ops_per_s`.

    python -m bench.strict_worker --serve --watchdog-s 600

runs `mesh bench strict --sweep`'s rows in turn, one node each, in one process (`serve`).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from typing import Any

from bench._procs import print_result, watchdog

__all__ = ["load", "main", "serve"]

TENANT, METRIC = "load", "read_iops"  # the strict limit under load
OPS_STRICT, OPS_GLOBAL = "fast", "fastg"  # the ops node's two limits
OPS_ROUNDS = 6  # alternations of strict and global in the ops timing
OPS_BATCH = 1_000  # try_admit calls between clock reads in a timed loop
CATCH_UP_MAX_S = 0.05  # a thread that fell behind its pace skips what is older than this
CREDIT_WAIT_S = 10.0  # how long the ops node may take to get its first block
WATCHDOG_SLACK_S = 120.0  # past the run's own length, a hung worker dumps its stacks


def _ask(
    mesh: Any, rate: float, until: float, out: list[int], offered: list[int], reasons: Counter[str]
) -> None:
    """try_admit at `rate` per second until `until` (time.time()); admitted instants to out,
    the number of asks to offered, the denials' reasons to reasons."""
    denied: Counter[str] = Counter()
    period = 1.0 / rate
    n = 0
    nxt = time.time()
    while True:
        now = time.time()
        if now >= until:
            break
        if nxt > now:
            time.sleep(nxt - now)
        nxt = max(nxt + period, time.time() - CATCH_UP_MAX_S)
        v = mesh.try_admit(TENANT, METRIC)
        n += 1
        if v.allowed:
            out.append(time.time_ns())
        else:
            denied[v.reason.value] += 1
    offered.append(n)
    reasons.update(denied)  # Counter.update under the GIL: one call per thread


def _timed(mesh: Any, tenant: str, seconds: float) -> tuple[int, float]:
    """Calls of try_admit(tenant) in about `seconds`, and the time they took."""
    try_admit = mesh.try_admit
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(OPS_BATCH):
            try_admit(tenant, METRIC)
        n += OPS_BATCH
        t = time.perf_counter()
        if t >= end:
            return n, t - t0


def ops(config: str, seconds: float) -> dict[str, Any]:
    """try_admit ops/s on a strict limit holding credit vs a global limit, one node."""
    from mesh.node import Mesh

    mesh = Mesh(config).start()
    try:
        first = mesh.admit_blocking(OPS_STRICT, METRIC, timeout_s=CREDIT_WAIT_S)
        if not first.allowed:
            raise RuntimeError(f"the ops node got no credit: {first.reason}")
        _timed(mesh, OPS_STRICT, 0.1)  # warm-up: blocks sized for a tight loop's demand
        _timed(mesh, OPS_GLOBAL, 0.1)
        totals = {OPS_STRICT: [0, 0.0], OPS_GLOBAL: [0, 0.0]}
        for _ in range(OPS_ROUNDS):
            for tenant in (OPS_STRICT, OPS_GLOBAL):
                n, took = _timed(mesh, tenant, seconds / (2 * OPS_ROUNDS))
                totals[tenant][0] += n
                totals[tenant][1] += took
        stats = mesh.health().get("strict", {})
        denied = _denied(mesh)
    finally:
        mesh.stop()
    return {
        "strict_ops_per_s": int(totals[OPS_STRICT][0] / totals[OPS_STRICT][1]),
        "global_ops_per_s": int(totals[OPS_GLOBAL][0] / totals[OPS_GLOBAL][1]),
        "ops_strict_admitted": int(stats.get("admitted", 0)),
        "ops_denied": denied,
    }


def _denied(mesh: Any) -> dict[str, int]:
    """The ops node's denials by limit and reason (from its decision counts): the loops
    should time admissions, not denials."""
    out: dict[str, int] = {}
    for (tenant, _metric, vid), n in mesh.decisions.items():
        v = mesh.verdicts[vid]
        if not v.allowed:
            key = f"{tenant}:{v.reason.value}"
            out[key] = out.get(key, 0) + n
    return out


def load(mesh: Any, threads: int, rate: float, seconds: float) -> dict[str, Any]:
    """Wait for the start instant on stdin, ask from then for `seconds` on `threads` threads
    at `rate` each, stop the node; the result (without the ops timing)."""
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))
    until = start_at + seconds
    admitted: list[list[int]] = [[] for _ in range(threads)]
    offered: list[int] = []
    reasons: Counter[str] = Counter()
    asking = [
        threading.Thread(target=_ask, args=(mesh, rate, until, admitted[i], offered, reasons))
        for i in range(threads)
    ]
    for t in asking:
        t.start()
    for t in asking:
        t.join()
    strict = dict(mesh.health().get("strict", {}))
    mesh.stop()
    return {
        "admitted_ns": sorted(t for per in admitted for t in per),
        "offered": sum(offered),
        "strict": strict,
        "denied": dict(reasons),
    }


def serve() -> None:
    """One row after another (`mesh bench strict --sweep`), so a sweep pays the imports once
    per process: each stdin line is a job (`{"config", "threads", "rate", "seconds"}`); a
    node is started on its config, says ready, runs `load` and prints its result. An empty
    line or EOF ends the process."""
    from mesh.node import Mesh

    print('{"ready": true}', flush=True)
    while True:
        line = sys.stdin.readline()
        if not line.strip():
            return
        job = json.loads(line)
        mesh = Mesh(job["config"]).start()
        print('{"ready": true}', flush=True)
        print_result(load(mesh, int(job["threads"]), float(job["rate"]), float(job["seconds"])))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.strict_worker")
    p.add_argument("--config", default="")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--rate", type=float, default=0.0, help="asks per second, per thread")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--ops-config", dest="ops_config", default="")
    p.add_argument("--ops-seconds", dest="ops_seconds", type=float, default=0.0)
    p.add_argument("--serve", action="store_true", help="run the jobs stdin gives, in turn")
    p.add_argument("--watchdog-s", dest="watchdog_s", type=float, default=0.0)
    a = p.parse_args(argv)
    import asyncio

    from mesh.node import Mesh

    if a.serve:
        watchdog(asyncio.new_event_loop(), a.watchdog_s)
        serve()
        return 0
    if not a.config or a.rate <= 0 or a.seconds <= 0:
        p.error("--config, --rate and --seconds are required without --serve")
    watchdog(asyncio.new_event_loop(), a.seconds + a.ops_seconds + WATCHDOG_SLACK_S)
    mesh = Mesh(a.config).start()
    print('{"ready": true}', flush=True)
    result = load(mesh, a.threads, a.rate, a.seconds)
    if a.ops_seconds > 0:
        result.update(ops(a.ops_config, a.ops_seconds))
    print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`mesh bench strict`: the strict guarantee on a real fleet (DESIGN.md sections 1
and 5).

A governord process (SQLite in a temporary directory) holds tenant `load`'s node, rated
R per second with burst B for `read_iops`. `workers` processes (bench.strict_worker), each a
threaded `mesh.node.Mesh` in static membership with the others, run `threads` threads that
ask for a strict limit on (load, read_iops) at `offered_x` times R in total. One worker
reaches governord through a lossy link (a proxy in this process that delays every chunk and
cuts every connection now and then). About a third into the run governord is SIGKILLed and,
OUTAGE_S later, restarted on the same store and address.

Every admission's wall-clock instant (time.time_ns, one host: one clock) is recorded by its
worker; the bench merges them and computes:

* `max_excess`: max over every interval [t0, t1] of admitted - R * (t1 - t0) - B
  (ratemesh.envelope.excess_over_times); <= 0 keeps the guarantee. An instant is read just
  after try_admit returns, so it is late by at most a call; governord counts whole
  milliseconds (docs/strict.md, Assumptions), so up to `R * 1 ms` could show here for that
  alone; the target stays 0.
* `utilisation`: admissions outside the outage window [kill, restarted governord listening]
  over `R * (seconds - outage_s) + B`.
* `governor_calls_per_admitted`: the workers' credit calls to governord (reserves,
  returns and the one read of a key's rate, from each node's /health `strict` counters)
  per admitted unit.
* `strict_try_admit_ops_per_s`, `global_try_admit_ops_per_s`: after the load, worker 0 times
  tight try_admit loops on a second node of its own (tenant `fast`, rated far above any
  loop) on a strict limit holding credit and on a global limit, alternated, same process;
  `ops_denied` counts the denials in those loops by limit and reason.
* `per_worker_admitted`: each worker's admissions, in worker order (the last one is behind
  the lossy link): how evenly R was shared.
* `resume_ms`: from the restarted governord's LISTENING line to the fleet's next admission
  (near 0 when credit granted before the kill was still held then).

`mode="global"` (`--mode global`) puts the same fleet, threads and offer on a `global` limit
of the same R and B instead (the mesh alone: owner GCRA and snapshots, no credit), with the
rest of the run unchanged, for the comparison in docs/figures.md; the figures carry `mode`.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from bench._procs import free_port, go, read_ready, write_config
from governor.testing.faults import DelayProxy
from ratemesh.envelope import excess_over_times

__all__ = [
    "run",
    "Governord",
    "LossyLink",
    "MODES",
    "WORKERS_MAX",
    "THREADS_MAX",
    "governor_calls",
    "load_policy",
    "max_excess",
    "rated",
    "reap",
    "spawn_server",
    "spawn_worker",
    "worker_config",
]

RATE, BURST = 2_000, 1_000  # governord's rate on tenant load's node: R per s, B
FAST_RATE = 10**9  # tenant fast's node (the ops timing): no loop reaches it
METRIC = "read_iops"
MESH_X = 20  # the mesh step of the strict limit: this many times R, so credit decides
SESSION_TTL_MS = 3_000  # a block lives at most this long
CREDIT: dict[str, int] = {"horizon_ms": 1_000, "lead_ms": 250, "idle_ms": 2_000}
OUTAGE_S = 1.0  # governord stays dead this long before its restart
KILL_AT = 1 / 3  # of the run
LINK_DELAY_S = 0.005  # the lossy link: every chunk, each way
LINK_CUT_EVERY_S = 1.5  # the lossy link: every open connection is cut this often
START_TIMEOUT_S = 60.0
RESULT_SLACK_S = 60.0  # past the run and the ops timing, for a worker's result
OPS_SECONDS = 2.0  # worker 0's try_admit timing, strict and global together
LOAD_KEY_ENV, FAST_KEY_ENV = "RATEMESH_BENCH_LOAD_KEY", "RATEMESH_BENCH_FAST_KEY"
TARGETS = {
    "target_max_excess": 0.0,
    "target_governor_calls_per_admitted": 0.02,
    "target_utilisation": 0.9,
    "target_strict_over_global": 0.7,
}
NS = 1_000_000_000
WORKERS_MAX = 32  # bounds of the CLI's flags: processes, and threads in each
THREADS_MAX = 64
MODES = ("strict", "global")  # the limit under load: credit, or the mesh alone to compare


class LossyLink:
    """A `DelayProxy` to `target` that delays every chunk by `delay_s` and cuts every open
    connection each `cut_every_s` (new ones are accepted); `cuts` counts the cuts that
    reset something, `forwarded` the bytes it carried (both ways) once stopped."""

    def __init__(self, target: str, delay_s: float, cut_every_s: float) -> None:
        self.proxy = DelayProxy(target)
        self.delay_s = delay_s
        self.cut_every_s = cut_every_s
        self.cuts = 0
        self.forwarded = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._cutting, daemon=True)

    def start(self) -> str:
        self.proxy.start()
        self.proxy.set_delay_ms(self.delay_s * 1000)
        self._thread.start()
        return self.proxy.address

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(START_TIMEOUT_S)
        self.forwarded = self.proxy.stats().bytes_forwarded
        self.proxy.close()

    def _cutting(self) -> None:
        while not self._stop.wait(self.cut_every_s):
            if self.proxy.cut():
                self.cuts += 1


def rated(key_env: str, rate: int, burst: int) -> dict[str, Any]:
    """A governord tenant whose key is in `key_env`, rated `rate` per second, burst `burst`."""
    return {"api_key_env": key_env, "rates": {METRIC: {"per_s": rate, "burst": burst}}}


class Governord:
    """governord on SQLite in `tmp`, on a fixed loopback address so a restart keeps it;
    `tenants` by name (`rated`), by default load at RATE and BURST and fast (the ops timing)."""

    def __init__(
        self, tmp: Path, keys: dict[str, str], tenants: dict[str, Any] | None = None
    ) -> None:
        if tenants is None:
            tenants = {
                "load": rated(LOAD_KEY_ENV, RATE, BURST),
                "fast": rated(FAST_KEY_ENV, FAST_RATE, FAST_RATE),
            }
        self.addr = f"127.0.0.1:{free_port()}"
        self.env = dict(os.environ, PYTHONHASHSEED="0", **keys)
        self.stderr = tmp / "governord.stderr"
        self.config = write_config(
            tmp / "governord.yaml",
            {
                "listen": self.addr,
                "store": f"sqlite:{tmp / 'governord.db'}",
                "drain_s": 1,
                "session": {"ttl_ms": 2 * SESSION_TTL_MS, "min_ttl_ms": 100},
                "tenants": tenants,
            },
        )
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    def start(self) -> None:
        with open(self.stderr, "a") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "governor.cli", "--config", str(self.config)],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=self.env,
            )
        line = _first_line(self.proc, START_TIMEOUT_S)
        if not line.startswith("LISTENING"):
            self.close()
            tail = self.stderr.read_text()[-2000:]
            raise RuntimeError(f"governord did not start: {line!r} {tail}")
        self.starts += 1

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            _close(self.proc.stdout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            _close(self.proc.stdout)


def _close(f: IO[str] | None) -> None:
    if f is not None:
        f.close()


def _first_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The first line a child prints on stdout, or "" if it printed none in time."""
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        return proc.stdout.readline() if sel.select(timeout_s) else ""
    finally:
        sel.close()


def _policy(tenant: str, mode: str, rate: int, burst: int) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "metric": METRIC,
        "generation": 1,
        "mode": mode,
        "target_rate": rate,
        "global_burst": burst,
        "local_burst_cap": burst,
    }


def _spawn(args: list[str], stderr: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A Python child with stdin and stdout piped and stderr to a file (a full pipe of
    log lines would stall it)."""
    with open(stderr, "a") as err:
        return subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=dict(os.environ, PYTHONHASHSEED="0", **env),
        )


def load_policy(mode: str, rate: int, burst: int) -> dict[str, Any]:
    """Tenant load's mesh policy in `mode`. Strict: the mesh step is looser than governord's
    rate (MESH_X times), so credit decides; global: R and B themselves."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "strict":
        return _policy("load", "strict", MESH_X * rate, MESH_X * rate)
    return _policy("load", "global", rate, burst)


def worker_config(
    tmp: Path,
    member: str,
    members: dict[str, str],
    policy: dict[str, Any],
    *,
    governord: str,
    credit: dict[str, int] | None,
    key_env: str = LOAD_KEY_ENV,
) -> Path:
    """One worker's node config: static membership of `members`, tenant load's policy, and
    a strict section reaching `governord` with the key in `key_env` (so spending at that
    key's governord tenant); no `credit:` key when `credit` is None: the defaults."""
    strict: dict[str, Any] = {
        "governord": governord,
        "api_key_env": key_env,
        "session_ttl_ms": SESSION_TTL_MS,
    }
    if credit is not None:
        strict["credit"] = credit
    return write_config(
        tmp / f"{member}.yaml",
        {
            "member_id": member,
            "listen": members[member],
            "membership": {"source": "static", "members": members},
            "policies": {"inline": [policy]},
            "shutdown_drain_ms": 300,
            "strict": strict,
        },
    )


def spawn_worker(
    config: Path,
    keys: dict[str, str],
    threads: int,
    per_thread: float,
    seconds: float,
    *,
    extra: list[str] | None = None,
) -> subprocess.Popen[str]:
    """A bench.strict_worker on `config`, its stderr beside the config."""
    args = ["-m", "bench.strict_worker", "--config", str(config)]
    args += ["--threads", str(threads), "--rate", str(per_thread), "--seconds", str(seconds)]
    return _spawn(args + (extra or []), config.with_suffix(".stderr"), keys)


def spawn_server(stderr: Path, keys: dict[str, str], watchdog_s: float) -> subprocess.Popen[str]:
    """A bench.strict_worker that runs the jobs stdin gives it, in turn (`--serve`)."""
    args = ["-m", "bench.strict_worker", "--serve", "--watchdog-s", str(watchdog_s)]
    return _spawn(args, stderr, keys)


def max_excess(times_ns: list[int], rate: int, burst: int) -> float:
    """The most admitted over any interval beyond R * (t1 - t0) + B, from sorted unit
    admission instants (ratemesh.envelope.excess_over_times); 0.0 for none."""
    return excess_over_times(times_ns, [1] * len(times_ns), rate, burst) if times_ns else 0.0


def governor_calls(results: list[dict[str, Any]]) -> int:
    """The workers' credit calls to governord: reserves, returns and the one read of a key's
    rate (GetNode, for the burst), from each node's /health `strict` counters."""
    return sum(
        int(r["strict"]["reserves"])
        + int(r["strict"]["returned"])
        + int(r["strict"].get("rate_lookups", 0))
        for r in results
    )


def run(
    *,
    workers: int = 4,
    threads: int = 4,
    seconds: float = 10.0,
    offered_x: float = 5.0,
    mode: str = "strict",
) -> dict[str, Any]:
    """Run the fleet for `seconds` (governord killed at KILL_AT of it); the figures.

    `mode` "global": the same fleet, threads and offer against a `global` limit of the same
    R and B (owner GCRA and snapshots, no credit), for comparison; everything else (the
    governord kill, the lossy link to it, the ops timing) runs the same."""
    policy = load_policy(mode, RATE, BURST)
    keys = {LOAD_KEY_ENV: secrets.token_hex(16), FAST_KEY_ENV: secrets.token_hex(16)}
    with tempfile.TemporaryDirectory(prefix="ratemesh-bench-strict-") as name:
        tmp = Path(name)
        gov = Governord(tmp, keys)
        link: LossyLink | None = None
        procs: list[subprocess.Popen[str]] = []
        try:
            gov.start()
            link = LossyLink(gov.addr, LINK_DELAY_S, LINK_CUT_EVERY_S)
            lossy_addr = link.start()
            members = {f"w{i}": f"127.0.0.1:{free_port()}" for i in range(workers)}
            per_thread = offered_x * RATE / (workers * threads)
            for i, m in enumerate(members):
                cfg = worker_config(
                    tmp,
                    m,
                    members,
                    policy,
                    governord=lossy_addr if i == workers - 1 else gov.addr,
                    credit=CREDIT,
                )
                extra = []
                if i == 0:
                    extra += ["--ops-config", str(_ops_config(tmp, gov.addr))]
                    extra += ["--ops-seconds", str(OPS_SECONDS)]
                procs.append(spawn_worker(cfg, keys, threads, per_thread, seconds, extra=extra))
            for p in procs:
                read_ready(p, START_TIMEOUT_S)
            start_at = go(procs)
            time.sleep(max(0.0, start_at + seconds * KILL_AT - time.time()))
            killed_ns = time.time_ns()
            gov.kill()
            time.sleep(OUTAGE_S)
            gov.start()
            restarted_ns = time.time_ns()
            results = [read_ready(p, seconds + OPS_SECONDS + RESULT_SLACK_S) for p in procs]
        finally:
            for p in procs:
                reap(p)
            if link is not None:
                link.stop()
            gov.close()
    return _figures(
        results,
        mode=mode,
        workers=workers,
        seconds=seconds,
        start_ns=int(start_at * NS),
        outage=(killed_ns, restarted_ns),
        restarts=gov.starts - 1,
        link=(link.cuts, link.forwarded) if link is not None else (0, 0),
    )


def _ops_config(tmp: Path, governord: str) -> Path:
    """Worker 0's second node, for the ops timing: alone, tenant fast's key."""
    addr = f"127.0.0.1:{free_port()}"
    return write_config(
        tmp / "ops.yaml",
        {
            "member_id": "ops",
            "listen": addr,
            "membership": {"source": "static", "members": {"ops": addr}},
            "policies": {
                "inline": [
                    _policy("fast", "strict", FAST_RATE, FAST_RATE),
                    _policy("fastg", "global", FAST_RATE, FAST_RATE),
                ]
            },
            "shutdown_drain_ms": 300,
            "strict": {
                "governord": governord,
                "api_key_env": FAST_KEY_ENV,
                "session_ttl_ms": SESSION_TTL_MS,
            },
        },
    )


def reap(p: subprocess.Popen[str]) -> None:
    """Kill a child that is still running, and close its pipes."""
    if p.poll() is None:
        p.kill()
        p.wait()
    for f in (p.stdin, p.stdout):
        with contextlib.suppress(OSError):
            _close(f)


def _resume_ms(times: list[int], ready_ns: int) -> float | None:
    """ms from `ready_ns` to the first of the sorted `times` at or after it (None: none)."""
    i = bisect.bisect_left(times, ready_ns)
    return round((times[i] - ready_ns) / 1e6, 1) if i < len(times) else None


def _figures(
    results: list[dict[str, Any]],
    *,
    mode: str,
    workers: int,
    seconds: float,
    start_ns: int,
    outage: tuple[int, int],
    restarts: int,
    link: tuple[int, int],  # the lossy link's cuts and bytes carried
) -> dict[str, Any]:
    times = sorted(t for r in results for t in r["admitted_ns"])
    excess = max_excess(times, RATE, BURST)
    killed_ns, restarted_ns = outage
    outage_s = (restarted_ns - killed_ns) / NS
    in_run_s = max(0.0, min(outage_s, seconds - (killed_ns - start_ns) / NS))
    outside = sum(1 for t in times if not killed_ns <= t < restarted_ns)
    utilisation = outside / (RATE * (seconds - in_run_s) + BURST)
    before_s = (killed_ns - start_ns) / NS
    after_s = max(0.0, seconds - before_s - outage_s)
    before = sum(1 for t in times if t < killed_ns)
    calls = governor_calls(results)
    strict_ops = int(results[0]["strict_ops_per_s"])
    global_ops = int(results[0]["global_ops_per_s"])
    offered = sum(int(r["offered"]) for r in results)
    out: dict[str, Any] = {
        "mode": mode,
        "workers": workers,
        "seconds": seconds,
        "admitted": len(times),
        "max_excess": round(excess, 3),
        "governord_restarts": restarts,
        "governor_calls_per_admitted": round(calls / max(1, len(times)), 4),
        "utilisation": round(utilisation, 4),
        "strict_try_admit_ops_per_s": strict_ops,
        "global_try_admit_ops_per_s": global_ops,
        "rate": RATE,
        "burst": BURST,
        "offered_x_rate": round(offered / (RATE * seconds), 2),
        "outage_s": round(outage_s, 3),
        "outage_starts_at_s": round((killed_ns - start_ns) / NS, 3),
        "admitted_in_outage": len(times) - outside,
        # from the restarted governord's LISTENING line to the fleet's next admission (0 or
        # near it when credit granted before the kill was still held)
        "resume_ms": _resume_ms(times, restarted_ns),
        # the two sides of `utilisation`: before the kill, and from the restart on
        "utilisation_before_kill": round(before / (RATE * before_s + BURST), 4),
        "utilisation_after_restart": round((outside - before) / max(1.0, RATE * after_s), 4),
        "governor_calls": calls,
        "lossy_link_cuts": link[0],
        "lossy_link_bytes": link[1],
        "per_worker_admitted": [len(r["admitted_ns"]) for r in results],
        # the ops timing's denials per limit (fast: strict, fastg: global), from worker 0
        "ops_denied": results[0].get("ops_denied", {}),
        **TARGETS,
    }
    out["within_targets"] = (
        excess <= TARGETS["target_max_excess"]
        and out["governor_calls_per_admitted"] <= TARGETS["target_governor_calls_per_admitted"]
        and utilisation >= TARGETS["target_utilisation"]
        and strict_ops >= TARGETS["target_strict_over_global"] * global_ops
        and restarts >= 1
    )
    return out


if __name__ == "__main__":  # a quick look: python -m bench.strict
    print(run(seconds=6.0))

"""`mesh bench redis`: redis mode on real worker processes against one redis-server that
the bench starts itself (DESIGN.md section 5).

`workers` processes (bench.redis_worker), each a threaded `mesh.node.Mesh` with
shared_state.redis naming the bench's server, ask for one redis-mode limit (R per second,
burst B) at a paced OFFER_PER_S each, far above R together, through four phases on one
schedule:

* up (half of `seconds`): Redis answers. `admitted` counts what Redis admitted during the
  first server's life, `allowed_max` is the GCRA allowance over the span those decisions
  took, floor(B + R x (t1 - t0)), and `exact` is admitted <= allowed_max. `up_p99_us`: the
  decisions' latency, one round trip each.
* frozen (a quarter): the server is SIGSTOPped. Each decision waits at most the 5 ms
  deadline until five in a row open the breaker, then none waits. `frozen_p99_ms` (must be
  <= 10) and `frozen_max_ms` over the decisions made while it was stopped.
* down (a quarter): the server is SIGKILLed; the open breaker answers locally with no round
  trip. `down_p99_us` (must be <= 200).
* back: a new server on the same port; after the probe interval one call probes and a good
  answer closes the breaker. `recovered` and `recovery_ms` (from the restart to the first
  decision Redis made again).

`fallback_disclosed`: every decision the embedded limiter made carried the suspension
`redis_unreachable` (and there were some), and every decision Redis made carried none.
Latencies are wall-clock time around `Mesh.try_admit` in the worker (perf_counter_ns);
instants are time.time_ns on one host, one clock, the bench's signals included.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._procs import free_port, go, read_ready, spawn, stop
from ratemesh.envelope import percentile

__all__ = ["run", "RedisServer", "WORKERS_MAX", "CODES", "RATE", "BURST"]

RATE, BURST = 1_000, 100  # the redis-mode limit: R per second, B
OFFER_PER_S = 2_000  # each worker's paced asks
WORKERS_MAX = 32
PROBE_S = 5.0  # the breaker's probe interval (mesh.core.admission._breaker)
BACK_MARGIN_S = 2.0  # past the probe being due, for the breaker to close
START_TIMEOUT_S = 60.0
# A decision as a worker records it: Redis admitted / denied, the embedded limiter
# admitted / denied (suspended redis_unreachable), or anything else (a disclosure missing).
CODES = {"redis_ok": 0, "redis_no": 1, "local_ok": 2, "local_no": 3, "undisclosed": 4}
NS = 1_000_000_000


class RedisServer:
    """A redis-server of the caller's own on a free port, no persistence: start, SIGSTOP,
    SIGKILL, start again on the same port."""

    def __init__(self, binary: str, workdir: Path, port: int | None = None) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        import redis

        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(
            [self.binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, protocol=2)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.RedisError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise RuntimeError(f"redis-server on {self.port} did not start") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        self.thaw()
        self.kill()


def _sleep_until(t_ns: int) -> int:
    """Sleep until the wall clock reads `t_ns`; the instant it then read."""
    left = (t_ns - time.time_ns()) / NS
    if left > 0:
        time.sleep(left)
    return time.time_ns()


def _p99(values: list[int]) -> int:
    return percentile(values, 0.99) if values else 0


def run(*, workers: int = 4, seconds: float = 4.0) -> dict[str, Any]:
    binary = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/sbin")
    if binary is None:
        from ratemesh.errors import ConfigError

        raise ConfigError("redis-server", "is not installed (scripts/install-deps installs it)")
    up_s, frozen_s, down_s = seconds / 2, seconds / 4, seconds / 4
    tenant = f"bench-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="ratemesh-bench-redis-") as tmp:
        server = RedisServer(binary, Path(tmp))
        server.start()
        procs: list[subprocess.Popen[str]] = []
        try:
            for i in range(workers):
                args = ["-m", "bench.redis_worker", "--addr", server.addr]
                args += ["--tenant", tenant, "--index", str(i), "--rate", str(RATE)]
                args += ["--burst", str(BURST), "--offer", str(OFFER_PER_S)]
                procs.append(spawn(args))
            for p in procs:
                read_ready(p, START_TIMEOUT_S)
            start_at = go(procs, lead_s=0.5)
            t_start = int(start_at * NS)
            t_stop_plan = t_start + int(up_s * NS)
            t_end = t_stop_plan + int(max(frozen_s + down_s + 1.0, PROBE_S + BACK_MARGIN_S) * NS)
            for p in procs:  # when to stop asking
                assert p.stdin is not None
                p.stdin.write(f"{t_end}\n")
                p.stdin.flush()
            t_stop = _sleep_until(t_stop_plan)
            server.freeze()
            t_kill = _sleep_until(t_stop + int(frozen_s * NS))
            server.kill()
            t_restart = _sleep_until(t_kill + int(down_s * NS))
            server.start()
            t_back = time.time_ns()
            results = [
                read_ready(p, (t_end - time.time_ns()) / NS + START_TIMEOUT_S) for p in procs
            ]
        finally:
            for p in procs:
                stop(p)
            server.stop()
    return _report(results, workers, t_start, t_stop, t_kill, t_restart, t_back)


def _report(
    results: list[dict[str, Any]],
    workers: int,
    t_start: int,
    t_stop: int,
    t_kill: int,
    t_restart: int,
    t_back: int,
) -> dict[str, Any]:
    up: list[int] = []
    frozen: list[int] = []
    down: list[int] = []
    admitted = 0
    first = last = None
    back_at = None
    fallbacks = 0
    undisclosed = 0
    for r in results:
        for at, took, code in zip(r["at_ns"], r["took_ns"], r["codes"], strict=True):
            redis_decided = code in (CODES["redis_ok"], CODES["redis_no"])
            undisclosed += code == CODES["undisclosed"]
            fallbacks += code in (CODES["local_ok"], CODES["local_no"])
            if redis_decided and at + took <= t_restart:  # the first server's decisions
                admitted += code == CODES["redis_ok"]
                first = at if first is None else min(first, at)
                last = at + took if last is None else max(last, at + took)
            if redis_decided and at >= t_back:
                back_at = at + took if back_at is None else min(back_at, at + took)
            if t_start <= at < t_stop:
                up.append(took)
            elif t_stop <= at < t_kill:
                frozen.append(took)
            elif t_kill <= at < t_restart:
                down.append(took)
    span_ns = 0 if first is None or last is None else last - first
    allowed_max = BURST + RATE * span_ns // NS
    causes: dict[str, int] = {}
    for r in results:
        for cause, n in r["health"].get("fallbacks", {}).items():
            causes[cause] = causes.get(cause, 0) + n
    return {
        "workers": workers,
        "rate": RATE,
        "burst": BURST,
        "offered_per_s": OFFER_PER_S * workers,
        "admitted": admitted,
        "allowed_max": allowed_max,
        "exact": admitted <= allowed_max,
        "up_decisions": len(up),
        "up_p99_us": round(_p99(up) / 1e3, 1),
        "frozen_decisions": len(frozen),
        "frozen_p99_ms": round(_p99(frozen) / 1e6, 3),
        "frozen_max_ms": round(max(frozen, default=0) / 1e6, 3),
        "down_decisions": len(down),
        "down_p99_us": round(_p99(down) / 1e3, 1),
        "fallback_disclosed": undisclosed == 0 and fallbacks > 0,
        "fallbacks": fallbacks,
        "fallbacks_by_cause": dict(sorted(causes.items())),
        "breaker_opened": sum(r["health"].get("breaker_opened", 0) for r in results),
        "recovered": back_at is not None,
        "recovery_ms": None if back_at is None else round((back_at - t_restart) / 1e6, 1),
    }


if __name__ == "__main__":  # pragma: no cover - `mesh bench redis` is the entry point
    import json

    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(run(seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 4.0)))

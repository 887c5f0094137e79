"""`mesh bench flood`: `try_admit` latency while a ring member floods the node.

One real node (`Mesh`, threaded: the app calls `try_admit` from its own thread, the node's
loop runs in another) is in a static ring with `hostile`, a member that is a child process.
The child sends report batches of the largest legal size (`REPORT_ROWS_MAX` rows) of keys the node
owns and holds no policy for, over real gRPC, as fast as the node takes them; distinct keys
in every batch, so nothing is cached. The app thread calls `try_admit` back to back on a
known key and times each call, first without the flood (the in-run baseline), then under it.

Keys: `baseline` and `flood`, each with `p50_us`, `p99_us`, `p999_us`, `max_us` and
`calls_per_s`; `target_p99_us` (50, the issue's) and `within_target` (flood p99 under it);
`batches_received` and `batch_keys` (the flood as the node saw it); the node's named bounds
at work: `reports_sliced`, `reports_shed`, `deliver_hold_max_ms` (the longest one slice held
the node), `fetch_polls`, `policy_fetches_max` (`Owner._fetching` at its largest: FETCHING_MAX);
`gc_pause_max_ms` and `gc_collections` (the process's garbage collections during the flood:
the app embeds the node with CPython's default thresholds unless it calls `tune_gc`).
Latencies include waiting for the GIL, which the node's loop holds while it decodes a batch.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from array import array
from collections.abc import Iterator
from typing import Any

from bench._procs import free_port, read_ready, spawn, stop
from ratemesh.envelope import percentiles

__all__ = ["run"]

TARGET_P99_US = 50
HOSTILE = "hostile"
EPOCH = 7  # the hostile member's worker_epoch
HOT = {
    "tenant_id": "app",
    "metric": "read_iops",
    "generation": 1,
    "target_rate": 10**12,
    "global_burst": 10**12,
    "local_burst_cap": 10**9,
    "mode": "local",
}


def run(*, seconds: float = 3.0, batch_keys: int = 256, calls: int = 0) -> dict[str, Any]:
    """Each phase lasts `seconds` (or `calls` calls, when given)."""
    from mesh.node import Mesh

    addr = f"127.0.0.1:{free_port()}"
    hostile_addr = f"127.0.0.1:{free_port()}"  # never served: the child only sends
    cfg = {
        "member_id": "n",
        "listen": addr,
        "membership": {"source": "static", "members": {"n": addr, HOSTILE: hostile_addr}},
        "policies": {"inline": [HOT]},
    }
    node = Mesh(cfg, count_decisions=False).start()
    child = None
    try:
        driver = node._require()
        deadline = time.monotonic() + 10
        while len(node.ring) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        baseline = _phase(node, seconds, calls)
        child = spawn(["-m", "bench.flood", addr, str(batch_keys), str(seconds * 4 + 30)])
        read_ready(child, timeout_s=120)  # its batches are built
        start = driver.transport.stats()["received"]
        while driver.transport.stats()["received"] == start:
            time.sleep(0.01)  # the first batch arrived: the flood is on
        fetching_max = [0]
        watching = threading.Event()
        watcher = threading.Thread(
            target=_watch_fetching, args=(driver, fetching_max, watching), daemon=True
        )
        watcher.start()
        pauses = _GcPauses()
        with pauses:
            flood = _phase(node, seconds, calls)
        watching.set()
        received = driver.transport.stats()["received"] - start
        health = node.health()
    finally:
        if child is not None:
            stop(child)
        node.stop()
    bounds = health["bounds"]
    return {
        "seconds": seconds,
        "batch_keys": batch_keys,
        "baseline": baseline,
        "flood": flood,
        "target_p99_us": TARGET_P99_US,
        "within_target": flood["p99_us"] < TARGET_P99_US,
        "batches_received": received,
        "reports_sliced": bounds["reports_sliced"],
        "reports_shed": bounds["reports_shed"],
        "deliver_hold_max_ms": bounds["deliver_hold_max_ms"],
        "fetch_polls": bounds["fetch_polls"],
        "policy_fetches_max": fetching_max[0],
        "gc_pause_max_ms": round(pauses.max_ns / 1e6, 2),
        "gc_collections": pauses.count,
    }


class _GcPauses:
    """The longest garbage collection, and how many ran, while in the `with` block: a
    collection holds the GIL (and whatever lock the collecting thread holds) throughout."""

    def __init__(self) -> None:
        self.max_ns = 0
        self.count = 0
        self._began = 0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter_ns()
        else:
            self.count += 1
            self.max_ns = max(self.max_ns, time.perf_counter_ns() - self._began)

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def _phase(node: Any, seconds: float, calls: int) -> dict[str, float]:
    """Call try_admit back to back for `seconds` (or `calls` calls), timing each."""
    lat = array("q")
    clock = time.perf_counter_ns
    admit = node.try_admit
    start = b = clock()
    end = start + int(seconds * 1e9)
    while (len(lat) < calls) if calls else (b < end):
        for _ in range(100):
            a = clock()
            admit("app", "read_iops")
            b = clock()
            lat.append(b - a)
    p50, p99, p999, top = percentiles(lat, 0.50, 0.99, 0.999, 1.0)
    return {
        "calls": len(lat),
        "p50_us": round(p50 / 1000, 2),
        "p99_us": round(p99 / 1000, 2),
        "p999_us": round(p999 / 1000, 2),
        "max_us": round(top / 1000, 2),
        "calls_per_s": round(len(lat) * 1e9 / max(b - start, 1)),
    }


def _watch_fetching(driver: Any, peak: list[int], done: threading.Event) -> None:
    while not done.wait(0.01):
        peak[0] = max(peak[0], len(driver.member.owner._fetching))


# -- the hostile member (a child process) -------------------------------------------------------


def _batches(batch_keys: int, count: int) -> list[bytes]:
    """`count` encoded batches of `batch_keys` distinct keys each, all owned by n."""
    from mesh.core.messages import ReportBatch, encode
    from mesh.core.policy import Metric, RateKey
    from mesh.core.ring import Ring

    ring = Ring(["n", HOSTILE], 1)
    out: list[bytes] = []
    i = 0
    for _ in range(count):
        keys: list[RateKey] = []
        while len(keys) < batch_keys:
            key = RateKey(f"u{i}", Metric.READ_IOPS, 1)
            i += 1
            if ring.owns("n", key):
                keys.append(key)
        n = len(keys)
        batch = ReportBatch(HOSTILE, 1, EPOCH, tuple(keys), (1,) * n, (1,) * n, (0,) * n, (1,) * n)
        out.append(encode(batch))
    return out


def _child(addr: str, batch_keys: int, seconds: float) -> None:
    """Send the batches round and round on one stream for `seconds`, reading replies."""
    import json

    import grpc

    from mesh.core.messages import MAX_MESSAGE_BYTES
    from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
    from mesh.peer._wire import SCHEMA

    # Batches of distinct keys, more keys in all than the codec's cache of wire keys holds.
    payloads = _batches(batch_keys, -(-300_000 // batch_keys))
    print(json.dumps({"ready": True}), flush=True)
    end = time.monotonic() + seconds
    md = ((MEMBER_MD, HOSTILE), (SCHEMA_MD, SCHEMA), (EPOCH_MD, str(EPOCH)))

    def requests() -> Iterator[bytes]:
        k = 0
        while time.monotonic() < end:
            yield payloads[k % len(payloads)]
            k += 1

    opts = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    opts.append(("grpc.max_receive_message_length", MAX_MESSAGE_BYTES))
    with grpc.insecure_channel(addr, options=opts) as ch:
        call = ch.stream_stream(EXCHANGE)(requests(), metadata=md, timeout=seconds + 10)
        try:
            for _ in call:
                pass
        except grpc.RpcError:
            pass  # the parent stops us, or the deadline


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))

"""``governord bench store``: durable events per second through group commit, against the raw
commit rate of the same database measured in the same run (one durable insert per transaction).

durable_events_per_s: ``writers`` threads (16) consuming through the Authority for ``duration_s``;
every reply waited for its commit. single_writer_latency_ms: one thread, mean call latency.
group_commit_gain = durable_events_per_s / raw_commit_per_s.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tempfile
import threading
import time
from typing import Any

from governor.authority import Authority
from governor.engine import ROOT_ID, Consumed, Created
from governor.store import Backend, EventLog, PostgresBackend, SqliteBackend

__all__ = ["DEFAULT_DSN", "run"]

DEFAULT_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres"


def _backend(kind: str, where: str, dsn: str) -> Backend:
    if kind == "sqlite":
        return SqliteBackend(os.path.join(where, "bench.db"))
    return PostgresBackend(dsn, schema=f"governor_bench_{os.getpid()}")


def _raw_rate(backend: Backend, budget_s: float) -> float:
    backend.raw_commit(5)  # warm up
    n, elapsed = 10, 0.0
    while True:
        t0 = time.perf_counter()
        backend.raw_commit(n)
        elapsed = time.perf_counter() - t0
        if elapsed >= budget_s / 4 or n >= 100_000:
            return n / elapsed
        n *= 4


def run(
    kind: str, *, dsn: str = DEFAULT_DSN, writers: int = 16, duration_s: float = 3.0
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="governor-bench-") as where:
        backend = _backend(kind, where, dsn)
        try:
            return _measure(backend, kind, writers, duration_s)
        finally:
            if isinstance(backend, PostgresBackend):
                cleanup = PostgresBackend(dsn, schema=backend.schema)
                cleanup.drop_schema()
                cleanup.close()


def _measure(backend: Backend, kind: str, writers: int, duration_s: float) -> dict[str, Any]:
    log = EventLog(backend)
    raw = _raw_rate(backend, duration_s)
    authority = Authority(log, snapshot_every=50_000)
    try:
        leaf = authority.call(lambda e: e.create_node(None, ROOT_ID, "t", quotas={"http": 10**12}))
        assert isinstance(leaf, Created)
        node = leaf.node_id
        tokens = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(writers)]
        sessions = [
            authority.call(lambda e, tok=tok: e.open_session(node, 10**9, tok))[0]  # type: ignore[misc]
            for tok in tokens
        ]
        latencies = []
        deadline = time.perf_counter() + duration_s / 3
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            result = authority.call(lambda e: e.consume(sessions[0], node, "http", 1))
            latencies.append(time.perf_counter() - t0)
            assert isinstance(result, Consumed)
        stop = threading.Event()
        counts = [0] * writers

        def writer(i: int) -> None:
            sid = sessions[i]
            call = authority.call
            while not stop.is_set():
                call(lambda e: e.consume(sid, node, "http", 1))
                counts[i] += 1

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
        batches0 = log.batches
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(duration_s)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        batches = log.batches - batches0
    finally:
        authority.close()
    durable = sum(counts) / elapsed
    return {
        "store": kind,
        "durable_events_per_s": round(durable),
        "single_writer_latency_ms": round(statistics.fmean(latencies) * 1000, 3),
        "single_writer_p99_ms": round(
            sorted(latencies)[int(0.99 * (len(latencies) - 1))] * 1000, 3
        ),
        "raw_commit_per_s": round(raw),
        "group_commit_gain": round(durable / raw, 2),
        "writers": writers,
        "mean_batch_events": round(sum(counts) / max(1, batches), 1),
        "duration_s": duration_s,
    }

"""``governord bench store``: durable events per second through group commit, against the raw
commit rate of the same database measured in the same run (one durable insert per transaction).

durable_events_per_s: ``writers`` threads (16) consuming through the Authority for ``duration_s``;
every reply waited for its commit. single_writer_latency_ms: one thread, mean call latency.
group_commit_gain = durable_events_per_s / raw_commit_per_s.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import psycopg
from psycopg import sql

from governor.authority import Authority
from governor.engine import ROOT_ID, Consumed, Created
from governor.store import SCHEMES, EventLog, PostgresBackend, open_backend
from ratemesh.envelope import percentile

__all__ = ["DEFAULT_DSN", "KINDS", "run"]

DEFAULT_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres"
RAW_PAYLOAD = "x" * 100  # one row of each raw commit


class _RawCommits(Protocol):
    """One durable insert per transaction on the store's own database, with the backend's
    durability settings: the rate group commit is measured against."""

    def commit(self, n: int) -> None: ...

    def close(self) -> None: ...


class _SqliteRaw:
    def __init__(self, path: str, schema: str) -> None:
        # as SqliteBackend: WAL journal, every commit fsync'd
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS governor_raw_bench (i INTEGER, payload TEXT)"
        )

    def commit(self, n: int) -> None:
        c = self._conn
        for i in range(n):
            c.execute("BEGIN IMMEDIATE")
            c.execute("INSERT INTO governor_raw_bench (i, payload) VALUES (?, ?)", (i, RAW_PAYLOAD))
            c.execute("COMMIT")

    def close(self) -> None:
        self._conn.execute("DROP TABLE governor_raw_bench")
        self._conn.close()


class _PostgresRaw:
    def __init__(self, dsn: str, schema: str) -> None:
        # as PostgresBackend: autocommit, the server's synchronous_commit = on
        self._conn = psycopg.connect(dsn, autocommit=True, application_name="governord-bench")
        self._table = sql.Identifier(schema, "raw_bench")
        self._conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        self._conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (i INTEGER, payload TEXT)").format(self._table)
        )

    def commit(self, n: int) -> None:
        insert = sql.SQL("INSERT INTO {} (i, payload) VALUES (%s, %s)").format(self._table)
        cur = self._conn.cursor()
        for i in range(n):
            with self._conn.transaction():
                cur.execute(insert, (i, RAW_PAYLOAD))

    def close(self) -> None:
        self._conn.execute(sql.SQL("DROP TABLE {}").format(self._table))
        self._conn.close()


# the raw commit of each durable scheme in governor.store.SCHEMES (a test keeps them equal)
_RAW: dict[str, Callable[[str, str], _RawCommits]] = {
    "sqlite": _SqliteRaw,
    "postgres": _PostgresRaw,
}
KINDS = tuple(name for name, scheme in SCHEMES.items() if scheme.durable)


def _raw_rate(raw: _RawCommits, budget_s: float) -> float:
    raw.commit(5)  # warm up
    n, elapsed = 10, 0.0
    while True:
        t0 = time.perf_counter()
        raw.commit(n)
        elapsed = time.perf_counter() - t0
        if elapsed >= budget_s / 4 or n >= 100_000:
            return n / elapsed
        n *= 4


def run(
    kind: str, *, dsn: str = DEFAULT_DSN, writers: int = 16, duration_s: float = 3.0
) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    scheme = SCHEMES[kind]
    schema = f"governor_bench_{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="governor-bench-") as where:
        # a scheme named by a DSN (PostgreSQL) gets --dsn; a file one, a file in ``where``
        target = dsn if scheme.whole else os.path.join(where, "bench.db")
        backend = open_backend(kind, target, schema=schema)
        try:
            log = EventLog(backend)
            raw = _RAW[kind](target, schema)
            try:
                rate = _raw_rate(raw, duration_s)
            finally:
                raw.close()
            return _measure(log, kind, rate, writers, duration_s)
        finally:
            if isinstance(backend, PostgresBackend):
                cleanup = PostgresBackend(dsn, schema=backend.schema)
                cleanup.drop_schema()
                cleanup.close()


def _measure(
    log: EventLog, kind: str, raw: float, writers: int, duration_s: float
) -> dict[str, Any]:
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
        "single_writer_p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
        "raw_commit_per_s": round(raw),
        "group_commit_gain": round(durable / raw, 2),
        "writers": writers,
        "mean_batch_events": round(sum(counts) / max(1, batches), 1),
        "duration_s": duration_s,
    }

"""Crashes: SIGKILL under concurrent load loses no acknowledged event; a failed commit stops the
process with a non-zero status; the record it leaves loads and holds every acknowledgement."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from governor.engine import Engine, ManualClock
from governor.store import EXIT_COMMIT_FAILED, EventLog
from tests.governor._stores import StoreTarget, make_target

pytestmark = pytest.mark.slow  # every test runs a workload process and kills it

ROOT = Path(__file__).resolve().parents[3]
WORKLOAD = Path(__file__).resolve().parents[1] / "_workload.py"
KILLS = 20
KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreTarget]:
    yield from make_target(request.param, tmp_path)


def _start(store: StoreTarget, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}
    cmd = [
        sys.executable,
        str(WORKLOAD),
        "--store",
        store.kind,
        "--target",
        store.target,
    ]
    if store.kind == "postgres":
        cmd += ["--schema", store.schema]
    return subprocess.Popen(
        [*cmd, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _tally(
    lines: list[str],
    nodes: dict[tuple[int, int], int],
    acked: dict[tuple[int, int], int],
    run: int,
) -> None:
    for line in lines:
        parts = line.split()
        if parts and parts[0] == "node":
            nodes[(run, int(parts[1]))] = int(parts[2])
        elif parts and parts[0] == "ack":
            key = (run, int(parts[1]))
            acked[key] = acked.get(key, 0) + 1


def _check_record(
    store: StoreTarget,
    nodes: dict[tuple[int, int], int],
    acked: dict[tuple[int, int], int],
) -> None:
    backend = store.backend()
    try:
        loaded = EventLog(backend).load()
    finally:
        backend.close()
    engine = Engine.restore(loaded.snapshot, loaded.events, ManualClock(0), lambda e: None)
    for key, node_id in nodes.items():
        used = engine.state.nodes[node_id].used.get("http", 0)
        # every acknowledged consume is on record; at most the one in flight is there unacknowledged
        assert acked.get(key, 0) <= used <= acked.get(key, 0) + 1, (
            key,
            used,
            acked.get(key),
        )


def _drain(proc: subprocess.Popen[str], timeout_s: float = 60) -> tuple[str, str]:
    """Read what is left through the same buffered pipes readline() used (communicate() would
    bypass their buffers and lose lines already read ahead), then reap the process."""
    assert proc.stdout is not None and proc.stderr is not None
    killer = threading.Timer(timeout_s, proc.kill)
    killer.start()
    try:
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait()
    finally:
        killer.cancel()
    proc.stdout.close()
    proc.stderr.close()
    return out, err


def _run_until(proc: subprocess.Popen[str], n_acks: int, lines: list[str]) -> None:
    assert proc.stdout is not None
    seen = 0
    while seen < n_acks:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(
                f"workload exited early: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}"
            )
        lines.append(line)
        seen += line.startswith("ack")


@pytest.mark.slow
def test_sigkill_under_load_loses_no_acknowledged_event(store: StoreTarget) -> None:
    seed = 20261129
    rng = random.Random(seed)
    print(f"seed {seed}")
    nodes: dict[tuple[int, int], int] = {}
    acked: dict[tuple[int, int], int] = {}
    for run in range(KILLS):
        proc = _start(store, "--threads", "8", "--snapshot-every", "300")
        lines: list[str] = []
        try:
            _run_until(proc, rng.randint(1, 600), lines)
            time.sleep(rng.random() * 0.02)
        finally:
            proc.send_signal(signal.SIGKILL)
            out, _err = _drain(proc)
        assert proc.returncode == -signal.SIGKILL
        lines += out.splitlines()
        _tally(lines, nodes, acked, run)
        _check_record(store, nodes, acked)
    assert sum(acked.values()) > KILLS


def _sqlite_lock(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


@pytest.mark.slow
def test_a_failed_commit_stops_the_process(store: StoreTarget) -> None:
    app = f"gov-fail-{uuid.uuid4().hex[:8]}"
    proc = _start(store, "--threads", "4", "--busy-timeout-ms", "200", "--app-name", app)
    lines: list[str] = []
    _run_until(proc, 50, lines)
    lock = None
    if store.kind == "sqlite":
        lock = _sqlite_lock(store.target)  # another writer holds the database: commits fail
    else:
        with psycopg.connect(store.target, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (app,),
            )
    try:
        out, err = _drain(proc)
    finally:
        if lock is not None:
            lock.execute("ROLLBACK")
            lock.close()
    assert proc.returncode == EXIT_COMMIT_FAILED, err
    assert "commit failed" in err
    nodes: dict[tuple[int, int], int] = {}
    acked: dict[tuple[int, int], int] = {}
    _tally(lines + out.splitlines(), nodes, acked, 0)
    _check_record(store, nodes, acked)

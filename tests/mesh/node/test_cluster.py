"""Real worker processes, real gRPC on loopback: one fleet-wide limit, and an owner that
is SIGKILLed mid-run (etcd membership moves its keys)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.cluster import BUCKET_S
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from tests.mesh._cluster import B, R, start_workers
from tests.mesh._etcd import EtcdServer

pytestmark = pytest.mark.slow  # worker processes for seconds

HOT_KEY = RateKey("hot", Metric.READ_IOPS, 1)


def test_four_processes_enforce_one_fleet_wide_limit(tmp_path: Path) -> None:
    ids = [f"w{i}" for i in range(4)]
    run = start_workers(tmp_path, ids, seconds=10.0, hot_total=2 * R)
    try:
        results = run.results(ids)
    finally:
        run.close()
    env = run.envelope(results)
    assert env.admitted <= env.total_bound, env.explain()
    assert env.excess <= env.bound, env.explain()
    assert env.admitted >= 0.97 * env.ideal, env.explain()
    for r in results.values():
        assert r["health"]["membership"]["N"] == 4


def test_sigkill_owner_mid_run_moves_its_keys(tmp_path: Path, etcd: EtcdServer) -> None:
    ids = [f"w{i}" for i in range(4)]
    owner = Ring(ids, 1).owner_of(HOT_KEY)
    membership = {
        "source": "etcd",
        "endpoints": [etcd.url],
        "prefix": "/cluster-test/",
        "lease_ttl_s": 2,
        "poll_ms": 100,
    }
    run = start_workers(tmp_path, ids, seconds=9.0, hot_total=2 * R, membership=membership)
    try:
        time.sleep(max(0.0, run.start_at + 3.0 - time.time()))
        run.procs[owner].kill()  # SIGKILL: no leave, no flush; the lease must lapse
        survivors = [m for m in ids if m != owner]
        results = run.results(survivors)
    finally:
        run.close()
    env = run.envelope(results)
    assert env.admitted <= env.total_bound, env.explain()
    assert env.excess <= env.bound, env.explain()
    for m, r in results.items():
        ms = r["health"]["membership"]
        assert ms["N"] == 3 and owner not in ms["members"], f"{m} still sees {ms}"
    epochs = {r["health"]["membership"]["epoch"] for r in results.values()}
    assert len(epochs) == 1, f"survivors disagree on the ring epoch: {epochs}"
    new_owner = Ring(survivors, 2).owner_of(HOT_KEY)
    assert new_owner != owner
    # While the ring still holds the dead owner, views go stale and admit nothing; then
    # the new owner starts the key exhausted, refilling at R: no burst of B on takeover.
    buckets = run.buckets()
    killed_at = int(3.0 / BUCKET_S)
    gap = next((i for i in range(killed_at, len(buckets)) if buckets[i] == 0), None)
    assert gap is not None, "views kept admitting with their owner dead"
    resumed = next((i for i in range(gap, len(buckets)) if buckets[i] > 0), None)
    assert resumed is not None, "the hot key never resumed after the failover"
    first_100ms = sum(buckets[resumed : resumed + 10])
    assert first_100ms <= R * 0.1 + B / 2, (
        f"{first_100ms} admitted in the new owner's first 100 ms: it did not start conservatively"
    )
    tail = sum(buckets[-200:])
    assert tail > 0.5 * R, f"only {tail} admitted in the last 2 s after failover"

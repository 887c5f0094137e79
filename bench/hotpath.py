"""`mesh bench hotpath`: try_admit on one hot key and on 10,000 keys, beside `limits`.

Throughput is timed over a tight loop; latency percentiles from a second pass that times
each call with perf_counter_ns (so they include the ~30-60 ns the timer itself costs).
Memory per key is measured with tracemalloc over the views of 10,000 active keys.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from mesh.core.admission import Admission
from mesh.core.messages import SNAPSHOT_ROWS_MAX, RateSnapshot, SnapshotBatch
from mesh.core.policy import Metric, PolicyCache, TenantRatePolicy
from mesh.core.reporter import Reporter
from mesh.core.ring import Ring
from ratemesh.envelope import percentiles

BIG = 10**15


def _fleet_admission(tenants: list[str]) -> Admission:
    """A worker whose global views are fed snapshots: every call takes the allow path
    of the real mesh hot path (the deny path is the same length)."""
    policies = PolicyCache(TenantRatePolicy(t, Metric.READ_IOPS, 1, BIG, BIG, BIG) for t in tenants)
    ring = Ring(["w1"], 1)
    reporter = Reporter("w1", 1, ring)
    adm = Admission(policies, 0, reporter=reporter)
    snaps = []
    for t in tenants:
        adm.try_admit(t, "read_iops")
        key = policies.current(t, Metric.READ_IOPS).rate_key  # type: ignore[union-attr]
        snaps.append(RateSnapshot(key, 1, 1, BIG, 0, 0, receiver_epoch=1))
    step = SNAPSHOT_ROWS_MAX  # as an owner sends them: at most this many a batch
    for i in range(0, len(snaps), step):
        reporter.receive(0, SnapshotBatch.of("w1", 1, snaps[i : i + step]))
    return adm


def _throughput(fn: Callable[[str], Any], keys: list[str], ops: int) -> float:
    reps = max(1, ops // len(keys))
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            for k in keys:
                fn(k)
        elapsed = time.perf_counter_ns() - t0
    finally:
        gc.enable()
    return reps * len(keys) / (elapsed / 1e9)


def _latency(fn: Callable[[str], Any], keys: list[str], ops: int) -> tuple[int, int]:
    clock = time.perf_counter_ns
    samples = [0] * ops
    n = len(keys)
    gc.disable()
    try:
        for i in range(ops):
            k = keys[i % n]
            t0 = clock()
            fn(k)
            samples[i] = clock() - t0
    finally:
        gc.enable()
    p50, p99 = percentiles(samples, 0.50, 0.99)
    return p50, p99


def _measure(fn: Callable[[str], Any], keys: list[str], ops: int) -> dict[str, float]:
    for k in keys[: min(len(keys), 10_000)]:
        fn(k)  # warm up: first use opens views
    ops_s = _throughput(fn, keys, ops)
    p50, p99 = _latency(fn, keys, min(ops, 200_000))
    return {"ops_per_s": round(ops_s), "p50_ns": p50, "p99_ns": p99}


def _bytes_per_key(n: int) -> float:
    tenants = [f"tenant-{i:06d}" for i in range(n)]
    policies = PolicyCache(TenantRatePolicy(t, Metric.READ_IOPS, 1, BIG, BIG, BIG) for t in tenants)
    ring = Ring(["w1"], 1)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    adm = Admission(policies, 0, reporter=Reporter("w1", 1, ring))
    for t in tenants:
        adm.try_admit(t, "read_iops")
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n


def run(ops: int = 2_000_000, keys: int = 10_000) -> dict[str, Any]:
    from limits import parse
    from limits.storage import MemoryStorage
    from limits.strategies import MovingWindowRateLimiter

    hot = ["hot-tenant"]
    many = [f"tenant-{i:06d}" for i in range(keys)]
    adm = _fleet_admission(hot + many)
    try_admit = adm.try_admit

    def mesh_one(t: str) -> Any:
        return try_admit(t, "read_iops")

    limiter = MovingWindowRateLimiter(MemoryStorage())
    item = parse("1000000000/second")

    def limits_one(t: str) -> Any:
        return limiter.hit(item, t)

    limits_ops = max(20_000, ops // 20)
    out: dict[str, Any] = {
        "mesh.hot_key": _measure(mesh_one, hot, ops),
        "mesh.many_keys": _measure(mesh_one, many, ops),
        "limits.hot_key": _measure(limits_one, hot, limits_ops),
        "limits.many_keys": _measure(limits_one, many, limits_ops),
    }
    out["ratio_hot"] = round(
        out["mesh.hot_key"]["ops_per_s"] / out["limits.hot_key"]["ops_per_s"], 2
    )
    out["ratio_many"] = round(
        out["mesh.many_keys"]["ops_per_s"] / out["limits.many_keys"]["ops_per_s"], 2
    )
    out["bytes_per_key"] = round(_bytes_per_key(keys), 1)
    out["ops"] = ops
    out["keys"] = keys
    out["note"] = (
        "latency percentiles include the perf_counter_ns call around each "
        "operation; limits = MovingWindowRateLimiter(MemoryStorage)"
    )
    return out

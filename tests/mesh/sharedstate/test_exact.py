"""Exactness while Redis answers: several Mesh nodes in one process, threads on each,
against the real Redis on 127.0.0.1:6379. What Redis admitted over the run never exceeds
the GCRA allowance B + R x (t1 - t0); anything the embedded limiter answered (a deadline
missed on a loaded machine) is disclosed, and is not counted as exact."""

from __future__ import annotations

import threading
import time

import redis

from mesh.core.verdict import Step, Suspension
from mesh.node import Mesh
from tests.mesh.sharedstate._redis import SHARED, redis_config, unique

RATE, BURST = 400, 40
NODES, THREADS, SECONDS = 3, 3, 1.5


def test_many_nodes_never_exceed_the_allowance(shared_redis: redis.Redis) -> None:
    tenant = unique("exact")
    policy = {
        "tenant_id": tenant,
        "metric": "read_iops",
        "generation": 1,
        "target_rate": RATE,
        "global_burst": BURST,
        "local_burst_cap": 1,
        "mode": "redis",
    }
    nodes = [Mesh(redis_config(SHARED, [policy])).start() for _ in range(NODES)]
    exact = [0] * (NODES * THREADS)
    fallback = [0] * (NODES * THREADS)
    undisclosed = [0] * (NODES * THREADS)
    stop_at = [0.0]

    def work(i: int, mesh: Mesh) -> None:
        while time.monotonic() < stop_at[0]:
            v = mesh.try_admit(tenant, "read_iops")
            if v.step is Step.REDIS:
                exact[i] += v.allowed
                undisclosed[i] += v.suspended is not None
            else:
                fallback[i] += 1
                undisclosed[i] += v.suspended is not Suspension.REDIS_UNREACHABLE

    try:
        threads = [
            threading.Thread(target=work, args=(n * THREADS + t, nodes[n]))
            for n in range(NODES)
            for t in range(THREADS)
        ]
        t0 = time.monotonic()
        stop_at[0] = t0 + SECONDS
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
    finally:
        for m in nodes:
            m.stop()
    allowance = BURST + RATE * elapsed
    assert sum(exact) <= allowance, (sum(exact), allowance)
    assert sum(exact) >= BURST  # Redis answered and admitted (the shared bucket was used)
    assert sum(undisclosed) == 0

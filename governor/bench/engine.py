"""``governord bench engine``: the engine alone, in process, on one core.

consume_per_s: consumes on the leaf of a depth-4 chain (root > tenant > task > subtask), every
level capped, through a tenant-scoped session. acquire_release_per_s: an acquire and a release of
a lease on the same leaf, every level limited. The event sink discards: this is the engine's
ceiling, not durable throughput (that is ``bench store``).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from governor.engine import ROOT_ID, Consumed, Created, Engine, Granted, ManualClock

__all__ = ["run"]


def _chain(engine: Engine) -> tuple[int, int]:
    engine.set_quota(None, ROOT_ID, "http", 10**15)
    engine.set_limit(None, ROOT_ID, "db", 10**6)
    parent = ROOT_ID
    ids = []
    for name in ("tenant", "task", "subtask"):
        created = engine.create_node(
            None, parent, name, quotas={"http": 10**15}, limits={"db": 10**6}
        )
        assert isinstance(created, Created)
        parent = created.node_id
        ids.append(parent)
    sid, _ = engine.open_session(ids[0], 10**12, hashlib.sha256(b"bench").hexdigest())
    return sid, ids[-1]


def run(*, ops: int = 200_000) -> dict[str, Any]:
    clock = ManualClock(1)
    engine = Engine(clock, lambda event: None)
    sid, leaf = _chain(engine)
    consume = engine.consume
    t0 = time.perf_counter()
    for _ in range(ops):
        consume(sid, leaf, "http", 1)
    consume_s = time.perf_counter() - t0
    assert isinstance(consume(sid, leaf, "http", 1), Consumed)
    acquire, release = engine.acquire, engine.release
    n_leases = max(1, ops // 4)
    t0 = time.perf_counter()
    for _ in range(n_leases):
        granted = acquire(sid, leaf, "db")
        assert isinstance(granted, Granted)
        release(sid, granted.lease_id)
    lease_s = time.perf_counter() - t0
    return {
        "consume_per_s": round(ops / consume_s),
        "acquire_release_per_s": round(n_leases / lease_s),
        "consume_ns": round(consume_s / ops * 1e9),
        "chain_depth": 4,
        "ops": ops,
    }

"""``governord bench failover``: leader failovers under load, checked from the clients' side.

Three governord processes share one PostgreSQL schema (docs/failover.md); ``callers`` SDK
clients, each given every address, acquire, validate and release leases, consume, and reserve
and return credit blocks of a rated tenant resource, every call recorded (invocation and
completion times, outcome) in one history. The leader is SIGKILLed ``failovers`` times (every
``pause_every``-th time it is SIGSTOPped past its lease instead: alive, connected and silent,
so only the lease and the epoch can depose it); the process is restarted as a standby.

What comes out (DESIGN.md section 5):

* ``takeover_p50_ms`` / ``takeover_p99_ms``: from the kill (or pause) to the first call that
  completes ``ok`` after it, as a caller sees it;
* ``acked_lost``: acknowledged effects missing at the end: consumes the node does not count, and
  leases acquired (never released) that are no longer live;
* ``fencing_ids_reused``: lease and block ids granted twice;
* ``linearizability_violations``: the checker's verdict on the whole history
  (``governor.testing.linearizability``);
* ``strict_max_excess``: ``admitted(t0, t1) - R * (t1 - t0) - B`` at its worst over every
  interval (``ratemesh.envelope.rate_excess``), the units each caller spent from a block
  counted at the block's grant on record (must be <= 0: strict credit survives a takeover).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from governor.client import (
    AcquireTimeout,
    Client,
    Denied,
    GovernorClientError,
    Lease,
)
from governor.engine import _events as ev
from governor.store import EventLog, PostgresBackend
from governor.testing.linearizability import History, Recorder, Tree, TreeNode, check
from ratemesh.envelope import percentiles, rate_excess

from ._daemon import KEYS, Governord

__all__ = ["DEFAULT_DSN", "Params", "run"]

DEFAULT_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres"
KEY = KEYS["BENCH_KEY_A"]
RESOURCE, CLS, RATED = "http", "db", "api"
RATE_PER_S, RATE_BURST = 400, 100
TASK_QUOTA, TASK_LIMIT = 1_000_000, 2
BLOCK_UNITS = 10
NS_PER_MS = 1_000_000
SESSION_TTL_MS = 600_000  # outlasts the run: leases end only by release (the model's default)


@dataclass(frozen=True, slots=True)
class Params:
    failovers: int = 20
    callers: int = 16
    processes: int = 3
    lease_ms: int = 1500  # the recommended ha settings (docs/failover.md)
    renew_ms: int = 250
    pause_every: int = 4  # every 4th failover pauses the leader instead of killing it
    ops_between: int = 40  # ok calls between two failovers
    think_ms: int = 15  # each caller's pause between calls (bounds the history's size)
    seed: int = 0
    dsn: str = DEFAULT_DSN
    history_path: str | None = None


@dataclass
class _Run:
    history: History
    t0_ns: int
    oks: list[tuple[int, int]]  # (invoked, completed) ns of calls governord answered, in order
    acked_consumes: dict[int, int]
    unknown_consumes: dict[int, int]
    open_leases: dict[int, int]  # lease id -> task node: acked and not (surely) released
    spent: dict[int, int]  # block id -> units its caller spent from it


class _Caller:
    def __init__(self, i: int, rec: Recorder, node_id: int, run: _Run, rng: random.Random):
        self.i, self.rec, self.node, self.run, self.rng = i, rec, node_id, run, rng
        self.leases: list[Lease] = []

    def _ok(self, invoked: int) -> None:
        self.run.oks.append((invoked, time.monotonic_ns()))

    async def step(self) -> None:
        r = self.rng.random()
        t = time.monotonic_ns()
        try:
            if r < 0.35:
                await self.rec.consume(self.node, RESOURCE, 1)
                self.run.acked_consumes[self.node] += 1
            elif r < 0.55 and len(self.leases) < TASK_LIMIT:
                lease = await self.rec.acquire(self.node, CLS, timeout=0.05)
                self.leases.append(lease)
                self.run.open_leases[lease.lease_id] = self.node
            elif r < 0.7 and self.leases:
                lease = self.leases.pop(self.rng.randrange(len(self.leases)))
                await self.rec.release(lease)
                self.run.open_leases.pop(lease.lease_id, None)
            elif r < 0.8 and self.leases:
                await self.rec.validate(self.rng.choice(self.leases).lease_id)
            else:
                block = await self.rec.reserve_credit(self.node, RATED, BLOCK_UNITS)
                self._ok(t)
                t = time.monotonic_ns()
                used = self.rng.randrange(int(block["units"]) + 1)
                self.run.spent[int(block["block_id"])] = used
                await self.rec.return_credit(int(block["block_id"]), int(block["units"]) - used)
            self._ok(t)
        except (Denied, AcquireTimeout):
            self._ok(t)  # governord answered
        except GovernorClientError:
            if r < 0.35:
                self.run.unknown_consumes[self.node] += 1
        except TimeoutError:
            pass  # the recorder's local timeout: outcome unknown


def _leader_address(dsn: str, schema: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            f'SELECT address FROM "{schema}".leader WHERE id = 1'  # type: ignore[arg-type]
        ).fetchone()
    return str(row[0]) if row else None


async def _first_ok_after(run: _Run, since_ns: int, timeout_s: float) -> float | None:
    """Milliseconds from ``since_ns`` to the first answer to a call invoked after it."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        later = [done for invoked, done in run.oks[-200:] if invoked > since_ns]
        if later:
            return (min(later) - since_ns) / 1e6
        await asyncio.sleep(0.005)
    return None


def _grants_on_record(dsn: str, schema: str) -> dict[int, tuple[int, int]]:
    """block id -> (granted at, ms on governord's clock; node id), from the shared record."""
    log = EventLog(PostgresBackend(dsn, schema=schema, application_name="bench-failover"))
    try:
        loaded = log.load()
    finally:
        log.backend.close()
    if loaded.snapshot is not None:  # snapshot_every is set above what a run writes
        raise RuntimeError("the record was snapshotted: grants before it are not on record")
    return {
        e.block_id: (e.at_ms, e.node_id) for e in loaded.events if isinstance(e, ev.CreditGranted)
    }


def _excess(run: _Run, grants: dict[int, tuple[int, int]], tree: Tree, scope: int) -> float:
    """The worst interval's lead of spent credit over ``R * (t1 - t0) + B`` at the rated
    tenant, the spends timed by their blocks' grants on governord's own clock."""
    admissions = sorted(
        (grants[bid][0] * NS_PER_MS, grants[bid][1], used)
        for bid, used in run.spent.items()
        if used > 0
    )
    parents = {n.id: n.parent for n in tree.nodes.values()}
    worst = rate_excess(admissions, parents, {scope: (RATE_PER_S, RATE_BURST)}).get(scope)
    return -float(RATE_BURST) if worst is None or worst == float("-inf") else round(worst, 3)


async def _main(p: Params, procs: list[Governord]) -> dict[str, Any]:
    rng = random.Random(p.seed)
    addrs = ",".join(g.addr for g in procs)
    clients = [await Client(addrs, KEY, ttl_ms=SESSION_TTL_MS).connect() for _ in range(p.callers)]
    scope = clients[0].scope_id
    nodes = []
    for i, c in enumerate(clients):
        node = await c.create_node(
            f"caller-{i}", parent_id=scope, quotas={RESOURCE: TASK_QUOTA}, limits={CLS: TASK_LIMIT}
        )
        nodes.append(node)
    tree = Tree(
        {
            scope: TreeNode(scope, None, bursts={RATED: RATE_BURST}),
            **{
                n: TreeNode(n, scope, quotas={RESOURCE: TASK_QUOTA}, limits={CLS: TASK_LIMIT})
                for n in nodes
            },
        }
    )
    history = History(tree)
    run = _Run(
        history, time.monotonic_ns(), [], dict.fromkeys(nodes, 0), dict.fromkeys(nodes, 0), {}, {}
    )
    callers = [
        _Caller(
            i,
            Recorder(c, history, f"c{i}", call_timeout_s=10.0),
            nodes[i],
            run,
            random.Random(rng.random()),
        )
        for i, c in enumerate(clients)
    ]
    stop = asyncio.Event()

    async def loop(caller: _Caller) -> None:
        while not stop.is_set():
            await caller.step()
            await asyncio.sleep(p.think_ms / 1000 * (0.5 + caller.rng.random()))

    tasks = [asyncio.create_task(loop(c)) for c in callers]
    takeovers: list[float] = []
    paused = 0
    by_addr = {g.addr: g for g in procs}
    try:
        for k in range(p.failovers):
            target = len(run.oks) + p.ops_between
            while len(run.oks) < target:
                await asyncio.sleep(0.01)
            address = await asyncio.to_thread(_leader_address, p.dsn, procs[0].schema)
            leader = by_addr.get(address or "")
            if leader is None:
                raise RuntimeError("no leader row: the processes did not elect one")
            pause = p.pause_every > 0 and (k + 1) % p.pause_every == 0
            at = time.monotonic_ns()
            if pause:
                paused += 1
                leader.signal(signal.SIGSTOP)
            else:
                await asyncio.to_thread(leader.kill)
            took = await _first_ok_after(run, at, 30.0)
            if took is None:
                logs = "\n".join(f"--- {g.addr}\n{g.stderr()[-3000:]}" for g in procs)
                raise RuntimeError(f"no call succeeded within 30 s of failover {k + 1}\n{logs}")
            takeovers.append(took)
            if pause:
                leader.signal(signal.SIGCONT)  # it finds its epoch taken and exits 70
                await asyncio.to_thread(_wait_exit, leader)
            await asyncio.to_thread(leader.start)  # back as a standby
        target = len(run.oks) + p.ops_between
        while len(run.oks) < target:
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    lost = 0
    checker = clients[0]
    for node in nodes:
        used = (await checker.get_node(node))["used"].get(RESOURCE, 0)
        lost += max(0, run.acked_consumes[node] - used)
    for lease_id in run.open_leases:
        if not await checker.validate(lease_id):
            lost += 1
    for c in clients:
        await c.close()
    ids = [
        int(op.result[k])
        for op in history.ops
        if op.outcome == "ok"
        for k in ("lease_id", "block_id")
        if k in op.result and op.call in ("acquire", "reserve_credit")
    ]
    grants = await asyncio.to_thread(_grants_on_record, p.dsn, procs[0].schema)
    if p.history_path:
        history.save(p.history_path)
    started = time.perf_counter()
    verdict = check(history)
    p50, p99 = percentiles(takeovers, 0.50, 0.99) if takeovers else (0.0, 0.0)
    return {
        "failovers": len(takeovers),
        "paused_failovers": paused,
        "takeover_p50_ms": round(p50, 1),
        "takeover_p99_ms": round(p99, 1),
        "takeover_max_ms": round(max(takeovers, default=0.0), 1),
        "acked_lost": lost,
        "fencing_ids_reused": len(ids) - len(set(ids)),
        "linearizability_violations": len(verdict.violations),
        "linearizability_verdict": verdict.verdict,
        "linearizability_explained": [v.explain() for v in verdict.violations[:3]],
        "strict_max_excess": _excess(run, grants, tree, scope),
        "operations": len(history.ops),
        "callers": p.callers,
        "processes": p.processes,
        "lease_ms": p.lease_ms,
        "renew_ms": p.renew_ms,
        "check_s": round(time.perf_counter() - started, 2),
        "seed": p.seed,
    }


def _wait_exit(g: Governord) -> None:
    if g.proc is not None:
        try:
            g.proc.wait(30)
        except Exception:  # noqa: BLE001 - a process that will not stop is killed
            g.kill()
        if g.proc.stdout is not None:
            g.proc.stdout.close()


def run(p: Params) -> dict[str, Any]:
    schema = f"governor_failover_{os.getpid()}"
    config: dict[str, Any] = {
        "ha": {"lease_ms": p.lease_ms, "renew_ms": p.renew_ms},
        "session": {"ttl_ms": SESSION_TTL_MS, "min_ttl_ms": 100, "max_ttl_ms": SESSION_TTL_MS},
        "tenants": {
            "a": {
                "api_key_env": "BENCH_KEY_A",
                "rates": {RATED: {"per_s": RATE_PER_S, "burst": RATE_BURST}},
            },
            "b": {"api_key_env": "BENCH_KEY_B"},
        },
    }
    procs = [Governord("postgres", dsn=p.dsn, schema=schema, **config) for _ in range(p.processes)]
    try:
        for g in procs:
            g.start()
        return asyncio.run(_main(p, procs))
    finally:
        for g in procs:
            g.kill()
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[arg-type]

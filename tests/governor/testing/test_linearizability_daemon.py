"""A history recorded from 8 concurrent SDK clients of a real governord (SQLite), with one
SIGKILL and restart in the middle, is linearizable. A failing history is saved beside the
test's tmp dir (its path is printed) so it can be checked again with the CLI."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from governor.client import Client, GovernorClientError, Lease
from governor.testing.linearizability import History, Op, Recorder, Tree, TreeNode, check
from tests.governor._daemon import KEYS, Daemon

CLIENTS = 8
TASK_QUOTA = 120  # http units: the clients spend past it, so quota denials happen
TASK_LIMIT = 2  # db leases on the task (root: 4, from the daemon's config)
PHASE_S = 1.5  # of calls before the SIGKILL, and again after the restart
SEED = 18


async def worker(rec: Recorder, task_id: int, stop: asyncio.Event, rng: random.Random) -> None:
    held: list[Lease] = []  # leases whose release has not had a definite answer
    old: list[int] = []
    while not stop.is_set():
        try:
            if held:  # a release that may not have happened: ask again until it answers
                await rec.release(held[0])
                old.append(held.pop(0).lease_id)
                continue
            lease = await rec.acquire(task_id, "db", timeout=0.3)
            held.append(lease)
            await rec.validate(lease.lease_id)
            await rec.consume(task_id, "http", rng.randint(1, 2))
            await asyncio.sleep(rng.random() * 0.01)
            await rec.release(lease)
            old.append(held.pop().lease_id)
            if old and rng.random() < 0.3:
                await rec.validate(rng.choice(old))
        except (GovernorClientError, TimeoutError):
            await asyncio.sleep(0.01)


@pytest.mark.slow
def test_sdk_history_across_a_sigkill_is_linearizable(
    sqlite_daemon: Daemon, tmp_path: Path
) -> None:
    daemon = sqlite_daemon
    root_db = daemon.config["root"]["limits"]["db"]

    async def scenario() -> History:
        clients = [Client(daemon.addr, KEYS["KEY_A"], ttl_ms=20_000) for _ in range(CLIENTS)]
        for c in clients:
            await c.connect()
        try:
            setup = clients[0]
            task_id = await setup.create_node(
                "lin", quotas={"http": TASK_QUOTA}, limits={"db": TASK_LIMIT}
            )
            tenant = await setup.get_node(setup.scope_id)
            tree = Tree(
                {
                    1: TreeNode(1, None, limits={"db": root_db}),
                    tenant["node_id"]: TreeNode(
                        tenant["node_id"],
                        1,
                        quotas=tenant["quotas"],
                        limits=tenant["limits"],
                        used={k: v for k, v in tenant["used"].items() if k in tenant["quotas"]},
                    ),
                    task_id: TreeNode(
                        task_id, tenant["node_id"], {"http": TASK_QUOTA}, {"db": TASK_LIMIT}
                    ),
                }
            )
            history = History(tree, meta={"seed": SEED, "clients": CLIENTS})
            stop = asyncio.Event()
            recs = [
                Recorder(c, history, f"c{i}", call_timeout_s=1.0) for i, c in enumerate(clients)
            ]
            runs = [
                asyncio.create_task(worker(r, task_id, stop, random.Random(SEED * 100 + i)))
                for i, r in enumerate(recs)
            ]
            await asyncio.sleep(PHASE_S)
            killed_at = time.monotonic_ns()
            await asyncio.to_thread(daemon.kill)
            await asyncio.to_thread(daemon.start)
            history.meta["sigkill_ns"] = killed_at
            await asyncio.sleep(PHASE_S)
            stop.set()
            await asyncio.gather(*runs)
            return history
        finally:
            for c in clients:
                await c.close()

    history = asyncio.run(scenario())
    ops = history.ops
    saved = tmp_path / "history.json"
    history.save(saved)
    outcomes = {o: sum(1 for op in ops if op.outcome == o) for o in ("ok", "fail", "unknown")}
    killed = history.meta["sigkill_ns"]
    after = sum(1 for op in ops if op.outcome == "ok" and op.invoke_ns > killed)
    result = check(history)
    detail = f"seed {SEED}; history saved at {saved}; outcomes {outcomes}\n{result.explain()}"
    assert result.ok, detail
    # the run did what it is for: calls on both sides of the kill, denials, no silent skip
    assert outcomes["ok"] > 100 and after > 20, detail
    assert any(op.error == "quota" for op in ops), detail
    # and the same history with one stale read planted (a validate that says live after the
    # lease's release completed) is caught
    release = next(op for op in ops if op.call == "release" and op.result.get("released"))
    t = release.complete_ns or 0
    lid = release.args["lease_id"]
    history.add(Op(0, "z", "validate", {"lease_id": lid}, t + 1, t + 2, "ok", {"live": True}))
    stale = check(history)
    assert stale.verdict == "violation", stale.explain()
    assert f"validate says lease {lid} is live, but it is released" in stale.explain()

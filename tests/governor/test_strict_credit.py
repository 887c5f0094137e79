"""The strict guarantee end to end: real governord (SQLite, PostgreSQL, and a PostgreSQL leader
with a standby), several SDK clients spending credit blocks concurrently, governord SIGKILLed
and restarted mid-run (with a standby: the leader SIGKILLed, the standby taking over). Then, from
outside: the recorded admissions against ``admitted(t0, t1) <= R * (t1 - t0) + B`` for every
rated node and against the caps (``ratemesh.envelope``), each spend against its block's life on
record (C2), and the durable record replayed event by event with C1 (level + outstanding <= B)
and C3 checked at every grant and return (``governor.testing.credit``)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from governor.client import Client, StrictCredit
from governor.engine import Engine, ManualClock
from governor.store import EventLog
from governor.testing.credit import CreditLedger
from ratemesh.credit import CreditConfig
from ratemesh.envelope import cap_excess, rate_excess
from tests.governor._daemon import KEYS, Daemon
from tests.governor._stores import StoreTarget, make_target

pytestmark = pytest.mark.slow

KINDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("failover", marks=pytest.mark.postgres),  # a leader and a standby
]
TENANT_RATE = (120, 60)  # tenant a, from governord.yaml
PARENT_RATE = (100, 40)  # the strict node: 100 units/s, burst 40
CHILD_RATE = (60, 20)  # one of its two children is rated too
TENANT_CAP = 1000  # tenant a's "http" cap in the test config
WORKERS = 4
RUN_S = 7.0
KILL_AT_S = 2.0
NS_PER_MS = 1_000_000
# governord's clock counts whole milliseconds, so between two real instants its bucket can
# refill for up to one millisecond more than elapsed: the checker allows that much, no more.
CLOCK_GRAIN_S = 0.001


@pytest.mark.parametrize("kind", KINDS)
def test_the_strict_guarantee_holds_through_a_sigkill(kind: str, tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    for store in make_target("postgres" if kind == "failover" else kind, tmp_path):
        daemons = []
        for i in range(2 if kind == "failover" else 1):
            (tmp_path / f"d{i}").mkdir()
            daemon = Daemon(tmp_path / f"d{i}", store)
            if kind == "failover":
                daemon.config["ha"] = {"lease_ms": 600, "renew_ms": 100}
            daemon.config["tenants"]["a"]["rates"] = {
                "http": {"per_s": TENANT_RATE[0], "burst": TENANT_RATE[1]}
            }
            daemon.start()
            daemons.append(daemon)
        try:
            spends, nodes = asyncio.run(_run(daemons, random.Random(seed)))
            for daemon in daemons:
                daemon.stop()
            _check(store, spends, nodes, seed)
        finally:
            for daemon in daemons:
                daemon.close()


Spend = tuple[int, int, int, int, int]  # (time ms, session id, block id, units, node id)


async def _run(daemons: list[Daemon], rng: random.Random) -> tuple[list[Spend], dict[str, int]]:
    """Workers spend; the first daemon (the leader) is SIGKILLed at KILL_AT_S and started again
    (alone: the same process comes back; with a standby: the standby takes over first)."""
    daemon, addrs = daemons[0], ",".join(d.addr for d in daemons)
    async with Client(addrs, KEYS["KEY_A"]) as admin:
        strict = await admin.create_node("strict", rates={"http": PARENT_RATE})
        rated = await admin.create_node("rated", parent_id=strict, rates={"http": CHILD_RATE})
        plain = await admin.create_node("plain", parent_id=strict)
    nodes = {"tenant": admin.scope_id, "strict": strict, "rated": rated, "plain": plain}
    spends: list[Spend] = []
    started = time.monotonic()
    seen = {"before": 0, "after": 0}
    restarted = asyncio.Event()

    async def worker(i: int) -> None:
        node = rated if i % 2 else plain
        config = CreditConfig(horizon_ms=200, lead_ms=100, idle_ms=300)
        # a session TTL well above a restart, so the workers keep their sessions through it
        async with Client(addrs, KEYS["KEY_A"], ttl_ms=10_000) as client:
            async with StrictCredit(client, node, "http", config) as credit:
                while time.monotonic() - started < RUN_S:
                    verdict = await credit.admit(1, timeout_s=0.05)
                    if verdict.admitted:
                        now_ms = time.time_ns() // NS_PER_MS
                        for block_id, units in verdict.taken:
                            spends.append((now_ms, client.session_id, block_id, units, node))
                        seen["after" if restarted.is_set() else "before"] += 1
                    if rng.random() < 0.05:  # now and then a worker pauses: idle returns
                        await asyncio.sleep(0.4)

    async def chaos() -> None:
        await asyncio.sleep(KILL_AT_S)
        await asyncio.to_thread(daemon.kill)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(daemon.start)
        restarted.set()

    await asyncio.gather(chaos(), *(worker(i) for i in range(WORKERS)))
    assert seen["before"] > 0 and seen["after"] > 0, seen  # it admitted on both sides
    return spends, nodes


def _check(store: StoreTarget, spends: list[Spend], nodes: dict[str, int], seed: int) -> None:
    backend = store.backend()
    try:
        loaded = EventLog(backend).load()
    finally:
        backend.close()
    assert loaded.snapshot is None, "the run is shorter than a snapshot interval"
    # the durable record, replayed event by event with C1 and C3 checked at each credit event
    ledger = CreditLedger()
    engine = Engine.restore(None, [], ManualClock(0), lambda e: None)
    for event in loaded.events:
        engine.state.apply(event)
        ledger.on_event(engine, event)
    assert ledger.granted > 0 and ledger.returned > 0, (ledger.granted, ledger.returned)
    # C2: every spend from a block on record, before its expiry there
    for now_ms, session_id, block_id, units, _node in sorted(spends):
        ledger.on_spend(now_ms, session_id, block_id, units)
    # the envelope over every interval, per rated node, and the caps, from the admissions alone
    admissions = [(t * NS_PER_MS, node, units) for t, _, _, units, node in spends]
    rates = {
        nodes["tenant"]: TENANT_RATE,
        nodes["strict"]: PARENT_RATE,
        nodes["rated"]: CHILD_RATE,
    }
    excess = rate_excess(admissions, ledger.parents, rates)
    print(f"admitted {len(spends)}, blocks {ledger.granted}, returns {ledger.returned}, {excess}")
    for node_id, worst in excess.items():
        grain = rates[node_id][0] * CLOCK_GRAIN_S
        assert worst <= grain + 1e-9, f"seed {seed}: node {node_id} over its envelope by {worst}"
    assert (
        cap_excess(admissions, ledger.parents, {nodes["tenant"]: TENANT_CAP})[nodes["tenant"]] <= 0
    )
    # after replay: level + outstanding <= B on every bucket, now and at the end of the record
    restored = Engine.restore(
        None, loaded.events, ManualClock(time.time_ns() // NS_PER_MS), lambda e: None
    )
    ledger.check_buckets(restored, loaded.events[-1].at_ms)
    for node_id, (_, burst) in rates.items():
        view = restored.credit_level(node_id, "http")
        assert view is not None and view[0] + view[1] <= burst

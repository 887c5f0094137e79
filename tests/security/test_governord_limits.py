"""A tenant's reach is bounded and its answers leak nothing: against a real governord.

The attacks: a tenant created unlimited nodes (20,000 in 3.4 s); `governord hook` charged and
allowed PostToolUse; session ids that clean alike (`run a`, `run_a`) shared one run's budget;
ReturnCredit answered NOT_FOUND for an unknown block id and PERMISSION_DENIED for another
session's, telling which ids are live blocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from governor.engine import Denial, DenyReason, Engine, EngineConfig, ManualClock, NodeState
from tests.governor._daemon import KEYS, Daemon, Raw
from tests.governor._stores import make_target
from tests.governor.engine.test_engine import World
from tests.governor.test_hook import _call, _hook

NODES_MAX = 60  # the tenant bound these tests configure (nodes_per_tenant_max)
VICTIM_NODES = 15  # nodes the other tenant creates per phase (3 phases: under the bound)


def _started(tmp_path: Path, **extra: Any) -> Iterator[Daemon]:
    for store in make_target("sqlite", tmp_path):
        d = Daemon(tmp_path, store, **extra)
        d.start()
        try:
            yield d
        finally:
            d.close()


@pytest.fixture
def gov(tmp_path: Path) -> Iterator[Daemon]:
    yield from _started(tmp_path)


@pytest.fixture
def bounded(tmp_path: Path) -> Iterator[Daemon]:
    yield from _started(tmp_path, nodes_per_tenant_max=NODES_MAX)


def _create(raw: Raw, token: str, prefix: str, n: int) -> tuple[int, list[dict[str, Any]]]:
    """``n`` CreateNode calls; (how many created, the details of those refused)."""
    made, refused = 0, []
    for i in range(n):
        _, code, detail = raw("CreateNode", {"name": f"{prefix}{i}"}, token=token)
        if code is grpc.StatusCode.OK:
            made += 1
        else:
            refused.append({"code": code, **detail})
    return made, refused


@pytest.mark.slow
def test_a_tenant_cannot_create_nodes_without_bound(bounded: Daemon) -> None:
    gov = bounded
    raw = Raw(gov.addr)
    try:
        victim = raw.session(KEYS["KEY_B"], ttl_ms=60_000)
        baseline, _ = _create(raw, victim, "before", VICTIM_NODES)
        assert baseline == VICTIM_NODES

        attacker = raw.session(KEYS["KEY_A"], ttl_ms=60_000)
        made, refused = _create(raw, attacker, "flood", 10 * NODES_MAX)
        assert made == NODES_MAX - 1  # the tenant's own node counts
        assert len(refused) == 10 * NODES_MAX - made
        first = refused[0]
        assert first["code"] is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert first["denial"]["reason"] == "nodes" and first["denial"]["limit"] == NODES_MAX
        assert f"holds {NODES_MAX} of at most {NODES_MAX} nodes" in first["message"]
        scope = raw.ok("GetNode", {}, token=attacker)
        assert len(scope["children"]) == NODES_MAX - 1

        # the victim: another tenant creates as many as it did before the flood
        during, _ = _create(raw, victim, "during", VICTIM_NODES)
        assert during == baseline

        # the bound is rebuilt from the record after a restart
        gov.stop()
        gov.start()
        raw.close()
        raw = Raw(gov.addr)
        attacker = raw.session(KEYS["KEY_A"])
        assert _create(raw, attacker, "again", 5)[0] == 0
        victim = raw.session(KEYS["KEY_B"])
        assert _create(raw, victim, "after", VICTIM_NODES)[0] == baseline
    finally:
        raw.close()


def _runs(raw: Raw) -> dict[str, dict[str, int]]:
    """Tenant a's runs: node name -> used."""
    token = raw.session(KEYS["KEY_A"])
    scope = raw.ok("GetNode", {}, token=token)
    out = {}
    for cid in scope["children"]:
        node = raw.ok("GetNode", {"node_id": cid}, token=token)
        out[node["name"]] = node["used"]
    return out


@pytest.mark.slow
def test_the_hook_neither_charges_nor_allows_post_tool_use(gov: Daemon) -> None:
    before = _hook(gov.addr, _call("run-1", "toolu_1"))
    assert before.returncode == 0, before.stderr
    raw = Raw(gov.addr)
    try:
        baseline = _runs(raw)
        assert baseline == {"claude:run-1": {"tool_calls": 1}}
        post = _hook(gov.addr, _call("run-1", "toolu_2", hook_event_name="PostToolUse"))
        assert post.returncode == 2
        line = post.stderr.strip()
        assert len(line.splitlines()) == 1 and "PreToolUse" in line and "PostToolUse" in line
        fresh = _hook(gov.addr, _call("run-2", "toolu_1", hook_event_name="PostToolUse"))
        assert fresh.returncode == 2
        assert _runs(raw) == baseline  # nothing charged, no run created
        # the victim: the run's next real call is charged once, as before
        after = _hook(gov.addr, _call("run-1", "toolu_3"))
        assert after.returncode == 0, after.stderr
        assert _runs(raw) == {"claude:run-1": {"tool_calls": 2}}
    finally:
        raw.close()


@pytest.mark.slow
def test_session_ids_that_clean_alike_are_separate_runs(gov: Daemon) -> None:
    """`run a` spends its one-call budget; `run_a`, the victim, still has its own."""
    flags = ("--tool-calls", "1")
    spent = [_hook(gov.addr, _call("run a", f"toolu_{i}"), *flags).returncode for i in range(2)]
    assert spent == [0, 2]
    victim = _hook(gov.addr, _call("run_a", "toolu_0"), *flags)
    assert victim.returncode == 0, victim.stderr
    for agent in ("a b", "a_b"):  # subagent ids too
        out = _hook(gov.addr, _call("run-2", f"toolu_{agent}", agent_id=agent))
        assert out.returncode == 0, out.stderr
    raw = Raw(gov.addr)
    try:
        runs = _runs(raw)
    finally:
        raw.close()
    assert runs["claude:run_a"] == {"tool_calls": 1}
    assert len([n for n in runs if n.startswith("claude:run")]) == 3
    assert runs["claude:run-2"]["subagents"] == 2  # two agents, two children


@pytest.mark.slow
def test_return_credit_answers_alike_for_unknown_and_foreign_blocks(gov: Daemon) -> None:
    raw = Raw(gov.addr)
    try:
        owner = raw.session(KEYS["KEY_A"], ttl_ms=60_000)
        node = raw.ok("CreateNode", {"name": "s", "rates": {"http": [10, 30]}}, token=owner)
        block = raw.ok(
            "ReserveCredit",
            {"node_id": node["node_id"], "resource": "http", "units": 5},
            token=owner,
        )
        prober = raw.session(KEYS["KEY_B"], ttl_ms=60_000)
        unknown = 10**9
        answers = []
        for block_id in (block["block_id"], unknown, block["block_id"] + 1):
            reply, code, detail = raw(
                "ReturnCredit", {"block_id": block_id, "unused": 5}, token=prober
            )
            answers.append((code, None if reply is None else {**reply, "block_id": 0}, detail))
        assert answers[0] == answers[1] == answers[2], answers
        assert answers[0][0] is grpc.StatusCode.OK
        # the victim: its block is untouched and returns as before
        back = raw.ok("ReturnCredit", {"block_id": block["block_id"], "unused": 5}, token=owner)
        assert back["returned"] is True
        info = raw.ok("GetNode", {"node_id": node["node_id"]}, token=owner)
        assert info["credit"]["http"]["outstanding"] == 0
    finally:
        raw.close()


def test_the_node_count_follows_creates_purges_and_restores() -> None:
    """The engine alone: ended nodes count until purged, a purge frees room, and a restore
    (from events, and from a snapshot) rebuilds the same counts."""
    w = World(EngineConfig(nodes_per_tenant_max=4, retention_ms=1_000))
    tenant, other = w.node(name="t"), w.node(name="o")
    run = w.node(tenant, name="run")
    kids = [w.node(run, name=f"k{i}") for i in range(2)]
    denial = w.engine.create_node(None, run, "k2")
    assert denial == Denial(DenyReason.NODES, tenant, "nodes", 4, 4, 1)
    assert w.node(other, name="fine")  # another tenant has its own count
    w.engine.end_node(None, kids[0], NodeState.DONE)
    assert isinstance(w.engine.create_node(None, run, "k2"), Denial)  # ended: still held
    assert w.restored().state.tenant_nodes == w.engine.state.tenant_nodes == {tenant: 4, other: 2}
    w.clock.advance(1_001)
    w.engine.tick()  # the purge frees its place
    assert w.engine.state.tenant_nodes == {tenant: 3, other: 2}
    w.node(run, name="k2")
    snap = w.engine.snapshot()
    again = Engine.restore(snap, [], ManualClock(w.clock.now_ms()), lambda e: None)
    assert again.state.tenant_nodes == w.engine.state.tenant_nodes == {tenant: 4, other: 2}
    assert all(n.tenant in (None, tenant, other) for n in again.state.nodes.values())

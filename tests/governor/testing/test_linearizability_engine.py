"""The model agrees with the real engine (random sequential runs with overlapping intervals
always check ok), and the checker catches two planted failover bugs: a deposed leader whose
commits skip the epoch check, and a standby that serves before it has replayed the log."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.engine import ManualClock
from governor.testing.linearizability import Result, check
from tests.governor.testing._cluster import Db, Leader, Recording, build_tree

NODES = (2, 3, 4)
SLACK_NS = 3_000_000  # up to 3 ms either side of the instant a call ran: many overlap

step = st.tuples(
    st.integers(0, 3),  # client
    st.sampled_from(["acquire", "release", "validate", "consume", "reserve", "return"]),
    st.integers(0, 2),  # node
    st.integers(1, 6),  # amount / units / which lease or block
    st.integers(0, SLACK_NS),
    st.integers(1, SLACK_NS),
    st.sampled_from(["ok"] * 6 + ["lost", "never"]),  # answer kept, lost, never arrived
    st.integers(0, 4),  # ms the clock moves first
)


def run_random(steps: list[tuple[Any, ...]]) -> tuple[Result, Result, Recording]:
    clock = ManualClock(0)
    db = Db()
    leader = Leader(db, clock)
    sessions = build_tree(leader, 4)
    rec = Recording(clock, leader)
    leases: list[tuple[int, int]] = []  # (lease id, session)
    blocks: list[tuple[int, int, int]] = []  # (block id, session, units)
    for client, kind, node_i, n, before, after, fate, advance in steps:
        clock.advance(advance)
        sid, node = sessions[client], NODES[node_i]
        call: str
        args: dict[str, Any]
        if kind == "acquire":
            call, args = "acquire", {"node_id": node, "cls": "db"}
        elif kind in ("release", "validate"):
            lid, sid = leases[n % len(leases)] if leases else (n, sid)
            call, args = kind, {"lease_id": lid}
        elif kind == "consume":
            call, args = "consume", {"node_id": node, "resource": "http", "amount": n % 4 + 1}
        elif kind == "reserve":
            resource = "tok" if n % 2 else "http"
            call, args = "reserve_credit", {"node_id": node, "resource": resource, "units": n}
        else:
            bid, sid, units = blocks[n % len(blocks)] if blocks else (n, sid, 1)
            call, args = "return_credit", {"block_id": bid, "unused": n % (units + 1)}
        answer = rec.add(
            None if fate == "never" else leader,
            f"c{client}",
            sid,
            call,
            args,
            before_ns=before,
            after_ns=after,
            lose=fate == "lost",
        )
        if answer is not None and answer[0] == "ok":
            if call == "acquire":
                leases.append((answer[1]["lease_id"], sid))
            elif call == "reserve_credit":
                blocks.append((answer[1]["block_id"], sid, answer[1]["units"]))
    return check(rec.history), check(rec.history, partition=False), rec


@settings(max_examples=120)
@given(st.lists(step, min_size=1, max_size=40))
def test_random_engine_runs_are_linearizable(steps: list[tuple[Any, ...]]) -> None:
    parted, whole, rec = run_random(steps)
    assert parted.ok, parted.explain() + "\n" + "\n".join(o.describe() for o in rec.history.ops)
    assert whole.ok, whole.explain()


# ---- planted bugs: a deposed leader and a new one --------------------------------------


def takeover_run(
    *, check_epoch: bool = True, replay_setup_only: bool = False
) -> tuple[Result, Recording]:
    """c0 holds the task's only db lease and has spent its http cap on the old leader; then a
    standby takes over. c0 keeps talking to the old leader (it does not know), c1 and c2 to
    the new one, on the same task: a lease of the limit-1 class, a consume, a validate."""
    clock = ManualClock(0)
    db = Db()
    old = Leader(db, clock)
    sessions = build_tree(old, 3)
    setup_events = len(db.events)
    rec = Recording(clock, old)
    lease = rec.add(old, "c0", sessions[0], "acquire", {"node_id": 4, "cls": "db"})
    assert lease is not None and lease[0] == "ok"
    lid = lease[1]["lease_id"]
    rec.add(old, "c0", sessions[0], "consume", {"node_id": 4, "resource": "http", "amount": 5})
    clock.advance(1)
    new = Leader(db, clock, replay=setup_events if replay_setup_only else None)
    old.check_epoch = check_epoch
    # the new leader: c1 wants the task's slot and budget; c2 validates c0's lease
    rec.add(new, "c1", sessions[1], "acquire", {"node_id": 4, "cls": "db"})
    rec.add(new, "c1", sessions[1], "consume", {"node_id": 4, "resource": "http", "amount": 2})
    # the old leader, deposed: c0 releases and acquires again, and spends more
    rec.add(old, "c0", sessions[0], "release", {"lease_id": lid})
    rec.add(old, "c0", sessions[0], "acquire", {"node_id": 4, "cls": "db"})
    rec.add(old, "c0", sessions[0], "consume", {"node_id": 3, "resource": "http", "amount": 4})
    rec.add(new, "c2", sessions[2], "validate", {"lease_id": lid})
    rec.add(new, "c2", sessions[2], "consume", {"node_id": 3, "resource": "http", "amount": 8})
    return check(rec.history), rec


def explain(result: Result, rec: Recording) -> str:
    return result.explain() + "\n" + "\n".join(op.describe() for op in rec.history.ops)


def test_a_correct_takeover_is_linearizable() -> None:
    result, rec = takeover_run()
    assert result.ok, explain(result, rec)
    # the deposed leader answered nothing after the takeover: those calls are unknown
    assert [op.outcome for op in rec.history.ops[-5:]].count("unknown") == 3


def test_planted_bug_commit_without_epoch_check_is_caught() -> None:
    result, rec = takeover_run(check_epoch=False)
    assert result.verdict == "violation", explain(result, rec)
    assert {v.kind for v in result.violations} == {"linearizability"}, explain(result, rec)
    text = result.explain()
    # the stale state: c0's release on the old leader, then the new leader still says live,
    # and tenant 3's http cap (10) is exceeded by the two leaders' consumes (4 + 8)
    assert "validate says lease" in text and "used 4 of its http cap 10" in text, text


def test_planted_bug_standby_serving_before_replay_is_caught() -> None:
    result, rec = takeover_run(replay_setup_only=True)
    assert result.verdict == "violation", explain(result, rec)
    text = result.explain()
    # the new leader granted c1 the task's slot while c0's lease (on record) was live, with
    # the id the old leader had already given c0, and let c1 spend past the task's http cap
    assert any(v.kind == "fencing" and "granted 2 times" in v.message for v in result.violations)
    assert "no room for one more db lease" in text or "http cap 5" in text, text


def random_takeover(seed: int, *, bug: str = "") -> tuple[Result, Recording]:
    """Random calls through a leader that is replaced at random points, with deposed leaders
    still being called now and then. ``bug``: ``"epoch"`` (deposed leaders commit without the
    epoch check) or ``"replay"`` (a new leader serves after replaying only the setup)."""
    rng = random.Random(seed)
    clock = ManualClock(0)
    db = Db()
    leaders = [Leader(db, clock)]
    sessions = build_tree(leaders[0], 4)
    setup_events = len(db.events)
    rec = Recording(clock, leaders[0])
    leases: list[tuple[int, int]] = []
    for i in range(80):
        clock.advance(rng.randrange(3))
        if i in (25, 55) or rng.random() < 0.02:
            for old in leaders:
                old.check_epoch = bug != "epoch"
            leaders.append(Leader(db, clock, replay=setup_events if bug == "replay" else None))
        leader = leaders[-1] if rng.random() < 0.8 else rng.choice(leaders)
        c = rng.randrange(4)
        sid = sessions[c]
        pick = rng.random()
        if pick < 0.35 or not leases:
            call: str = "acquire"
            args: dict[str, Any] = {"node_id": rng.choice(NODES), "cls": "db"}
        elif pick < 0.6:
            lid, sid = rng.choice(leases)
            call, args = "release", {"lease_id": lid}
        elif pick < 0.75:
            call, args = "validate", {"lease_id": rng.choice(leases)[0]}
        else:
            amount = rng.randrange(1, 5)
            node = rng.choice(NODES)
            call, args = "consume", {"node_id": node, "resource": "http", "amount": amount}
        answer = rec.add(
            leader,
            f"c{c}",
            sid,
            call,
            args,
            before_ns=rng.randrange(2_000_000),
            after_ns=1 + rng.randrange(2_000_000),
        )
        if answer is not None and call == "acquire" and answer[0] == "ok":
            leases.append((answer[1]["lease_id"], sid))
    return check(rec.history), rec


@pytest.mark.parametrize("seed", range(30))
def test_random_takeovers_are_linearizable(seed: int) -> None:
    """Every correct run checks ok (the seed is in the test id)."""
    result, rec = random_takeover(seed)
    assert result.ok, f"seed {seed}\n" + explain(result, rec)


@pytest.mark.parametrize("bug", ["epoch", "replay"])
def test_random_takeovers_with_a_planted_bug_are_caught(bug: str) -> None:
    """The same random runs with either bug: nearly every seed is caught (a run can miss the
    bug only if no call ever observes the stale state)."""
    results = {seed: random_takeover(seed, bug=bug)[0] for seed in range(20)}
    missed = [seed for seed, r in results.items() if r.verdict != "violation"]
    assert len(missed) <= 2, f"{bug}: missed seeds {missed}"

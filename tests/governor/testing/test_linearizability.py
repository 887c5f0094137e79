"""The checker on hand-written histories: linearizable ones pass, each kind of fault is
reported with the operations involved; the history format round-trips and refuses bad input."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.client import (
    AcquireTimeout,
    Denied,
    LeaseEnded,
    RequestError,
    SessionLost,
    Unavailable,
)
from governor.testing.linearizability import (
    History,
    HistoryError,
    HistoryFull,
    Model,
    Op,
    Tree,
    TreeNode,
    check,
    check_fencing,
    outcome_of,
    partitions,
)
from governor.testing.linearizability.__main__ import main

# root 1 > tenants 2, 3; node 4 under tenant 2. Limits and caps on several levels.
TREE = Tree(
    {
        1: TreeNode(1, None, limits={"db": 3}),
        2: TreeNode(2, 1, quotas={"http": 10}, limits={"db": 1}, bursts={"tok": 10}),
        3: TreeNode(3, 1, quotas={"http": 10}),
        4: TreeNode(4, 2, quotas={"http": 5}),
    }
)


class B:
    """A history builder: ``b.ok("a", "acquire", 0, 10, node_id=2, cls="db", lease_id=7)``."""

    def __init__(self, tree: Tree = TREE, *, lease_expiry: bool = False) -> None:
        self.h = History(tree, lease_expiry=lease_expiry)

    def _add(self, client: str, call: str, t: tuple[int, int | None], outcome: str, **kw: Any) -> B:
        from governor.testing.linearizability import CALLS

        arg_names = CALLS[call][0]
        args = {k: v for k, v in kw.items() if k in arg_names}
        rest = {k: v for k, v in kw.items() if k not in arg_names}
        error = str(rest.pop("error", ""))
        if "got" in rest:  # a reserve's result units (``units`` is its argument)
            rest["units"] = rest.pop("got")
        self.h.add(Op(0, client, call, args, t[0], t[1], outcome, rest, error))  # type: ignore[arg-type]
        return self

    def ok(self, client: str, call: str, inv: int, comp: int, **kw: Any) -> B:
        return self._add(client, call, (inv, comp), "ok", **kw)

    def fail(self, client: str, call: str, inv: int, comp: int, error: str, **kw: Any) -> B:
        return self._add(client, call, (inv, comp), "fail", error=error, **kw)

    def unknown(self, client: str, call: str, inv: int, **kw: Any) -> B:
        return self._add(client, call, (inv, None), "unknown", **kw)

    def check(self) -> Any:
        return check(self.h)


def violation(b: B) -> str:
    result = b.check()
    assert result.verdict == "violation", result.explain()
    return str(result.explain())


def test_sequential_acquire_release_is_ok() -> None:
    b = B()
    b.ok("a", "acquire", 0, 10, node_id=2, cls="db", lease_id=5)
    b.ok("a", "validate", 11, 12, lease_id=5, live=True)
    b.ok("a", "release", 13, 14, lease_id=5, released=True)
    b.ok("a", "release", 15, 16, lease_id=5, released=False)
    b.ok("b", "validate", 17, 18, lease_id=5, live=False)
    b.ok("b", "acquire", 15, 30, node_id=2, cls="db", lease_id=9)
    b.fail("c", "acquire", 31, 32, "concurrency", node_id=4, cls="db")
    assert b.check().ok


def test_two_concurrent_acquires_on_a_limit_of_one_is_a_violation() -> None:
    b = B()
    b.ok("a", "acquire", 0, 10, node_id=2, cls="db", lease_id=5)
    b.ok("b", "acquire", 1, 11, node_id=4, cls="db", lease_id=6)
    text = violation(b)
    assert "no room for one more db lease" in text
    assert "#0" in text and "#1" in text


def test_concurrent_release_makes_room() -> None:
    b = B()
    b.ok("a", "acquire", 0, 10, node_id=2, cls="db", lease_id=5)
    b.ok("a", "release", 11, 30, lease_id=5, released=True)
    b.ok("b", "acquire", 12, 20, node_id=4, cls="db", lease_id=6)  # overlaps the release
    assert b.check().ok


def test_a_denial_with_room_is_a_violation() -> None:
    b = B()
    b.fail("a", "acquire", 0, 10, "concurrency", node_id=2, cls="db")
    assert "chain has room" in violation(b)


def test_consume_past_a_cap_is_a_violation_and_up_to_it_is_not() -> None:
    b = B()
    b.ok("a", "consume", 0, 10, node_id=4, resource="http", amount=3)
    b.ok("b", "consume", 0, 10, node_id=4, resource="http", amount=2)
    b.fail("c", "consume", 11, 12, "quota", node_id=4, resource="http", amount=1)
    b.ok("c", "consume", 13, 14, node_id=2, resource="http", amount=5)  # tenant's cap: 10
    assert b.check().ok
    b.ok("d", "consume", 15, 16, node_id=2, resource="http", amount=1)
    assert "used 10 of its http cap 10" in violation(b)


def test_a_quota_denial_needs_a_full_cap() -> None:
    b = B()
    b.ok("a", "consume", 0, 10, node_id=4, resource="http", amount=3)
    b.fail("b", "consume", 11, 12, "quota", node_id=4, resource="http", amount=2)
    assert "fits on every cap" in violation(b)


def test_a_reused_lease_id_is_a_fencing_violation() -> None:
    b = B()
    b.ok("a", "acquire", 0, 10, node_id=3, cls="db", lease_id=5)
    b.ok("a", "release", 11, 12, lease_id=5, released=True)
    b.ok("b", "acquire", 13, 14, node_id=3, cls="db", lease_id=5)
    result = b.check()
    assert result.verdict == "violation"
    assert any(v.kind == "fencing" and "granted 2 times" in v.message for v in result.violations)


def test_a_smaller_later_id_is_a_fencing_violation() -> None:
    b = B()
    b.ok("a", "acquire", 0, 10, node_id=3, cls="db", lease_id=8)
    b.ok(
        "b",
        "reserve_credit",
        11,
        12,
        node_id=3,
        resource="http",
        units=1,
        got=1,
        block_id=7,
        ttl_ms=1,
    )
    result = b.check()
    assert any("granted after id 8" in v.message for v in result.violations), result.explain()


def test_a_stale_read_after_a_completed_release_is_a_violation() -> None:
    b = B()
    b.ok("a", "acquire", 0, 10, node_id=3, cls="db", lease_id=5)
    b.ok("a", "release", 11, 12, lease_id=5, released=True)
    b.ok("b", "validate", 13, 14, lease_id=5, live=True)
    assert "validate says lease 5 is live, but it is released" in violation(b)


def test_a_read_concurrent_with_the_release_may_see_either() -> None:
    for live in (True, False):
        b = B()
        b.ok("a", "acquire", 0, 10, node_id=3, cls="db", lease_id=5)
        b.ok("a", "release", 11, 20, lease_id=5, released=True)
        b.ok("b", "validate", 12, 14, lease_id=5, live=live)
        assert b.check().ok, live


def test_lease_expiry_is_accepted_only_when_the_history_allows_it() -> None:
    for expiry in (False, True):
        b = B(lease_expiry=expiry)
        b.ok("a", "acquire", 0, 10, node_id=3, cls="db", lease_id=5)
        b.ok("b", "validate", 13, 14, lease_id=5, live=False)
        b.fail("a", "release", 15, 16, "lease_ended", lease_id=5)
        assert b.check().ok is expiry


def test_a_credit_block_id_granted_twice_is_a_violation() -> None:
    b = B()
    b.ok(
        "a",
        "reserve_credit",
        0,
        10,
        node_id=3,
        resource="http",
        units=2,
        got=2,
        block_id=7,
        ttl_ms=9,
    )
    b.ok(
        "b",
        "reserve_credit",
        11,
        12,
        node_id=3,
        resource="http",
        units=2,
        got=2,
        block_id=7,
        ttl_ms=9,
    )
    result = b.check()
    assert any("id 7 was granted 2 times" in v.message for v in result.violations)


def test_credit_blocks_never_exceed_the_burst_while_surely_live() -> None:
    ttl_ms = 1  # 1 ms = 1_000_000 ns of the history's clock
    b = B()
    b.ok(
        "a",
        "reserve_credit",
        0,
        10,
        node_id=2,
        resource="tok",
        units=6,
        got=6,
        block_id=7,
        ttl_ms=1,
    )
    b.ok(
        "b",
        "reserve_credit",
        11,
        20,
        node_id=4,
        resource="tok",
        units=4,
        got=4,
        block_id=8,
        ttl_ms=1,
    )
    assert b.check().ok
    b.ok(
        "c",
        "reserve_credit",
        21,
        30,
        node_id=2,
        resource="tok",
        units=1,
        got=1,
        block_id=9,
        ttl_ms=1,
    )
    assert "over its burst 10" in violation(b)
    # the same grant after both blocks may have expired is fine (the level refilled)
    b = B()
    b.ok(
        "a",
        "reserve_credit",
        0,
        10,
        node_id=2,
        resource="tok",
        units=6,
        got=6,
        block_id=7,
        ttl_ms=1,
    )
    b.ok(
        "b",
        "reserve_credit",
        11,
        20,
        node_id=4,
        resource="tok",
        units=4,
        got=4,
        block_id=8,
        ttl_ms=1,
    )
    late = ttl_ms * 1_000_000 + 20
    b.ok(
        "c",
        "reserve_credit",
        late,
        late + 1,
        node_id=2,
        resource="tok",
        units=1,
        got=1,
        block_id=9,
        ttl_ms=1,
    )
    assert b.check().ok


def test_a_return_applies_once_and_gives_the_cap_back() -> None:
    b = B()
    b.ok(
        "a",
        "reserve_credit",
        0,
        1,
        node_id=3,
        resource="http",
        units=10,
        got=10,
        block_id=7,
        ttl_ms=9,
    )
    b.fail("a", "consume", 2, 3, "quota", node_id=3, resource="http", amount=1)
    b.ok("a", "return_credit", 4, 5, block_id=7, unused=4, returned=True)
    b.ok("a", "consume", 6, 7, node_id=3, resource="http", amount=4)
    b.ok("a", "return_credit", 8, 9, block_id=7, unused=4, returned=False)
    assert b.check().ok
    b.ok("a", "return_credit", 10, 11, block_id=7, unused=4, returned=True)
    assert "a return applies once" in violation(b)


def test_an_unrated_grant_is_exactly_the_room() -> None:
    b = B()
    b.ok("a", "consume", 0, 1, node_id=3, resource="http", amount=7)
    b.ok(
        "a",
        "reserve_credit",
        2,
        3,
        node_id=3,
        resource="http",
        units=5,
        got=2,
        block_id=7,
        ttl_ms=9,
    )
    assert "grants min(asked, room) = 3" in violation(b)


def test_unknown_outcomes_may_take_effect_late_or_never() -> None:
    # an unknown acquire that took effect after a later acquire completed
    b = B()
    b.unknown("a", "acquire", 0, node_id=2, cls="db")
    b.ok("b", "acquire", 5, 10, node_id=2, cls="db", lease_id=9)
    b.fail("c", "acquire", 11, 12, "concurrency", node_id=2, cls="db")
    assert b.check().ok
    # an unknown consume may explain a later denial, or never have happened
    for denied in (True, False):
        b = B()
        b.unknown("a", "consume", 0, node_id=4, resource="http", amount=5)
        if denied:
            b.fail("b", "consume", 20, 21, "quota", node_id=4, resource="http", amount=1)
        else:
            b.ok("b", "consume", 20, 21, node_id=4, resource="http", amount=5)
        assert b.check().ok
    # but a definite failure took no effect
    b = B()
    b.fail("a", "consume", 0, 1, "timeout", node_id=4, resource="http", amount=5)
    b.fail("b", "consume", 20, 21, "quota", node_id=4, resource="http", amount=1)
    assert b.check().verdict == "violation"


def test_unknown_release_may_free_the_slot() -> None:
    b = B()
    b.ok("a", "acquire", 0, 1, node_id=2, cls="db", lease_id=5)
    b.unknown("a", "release", 2, lease_id=5)
    b.ok("b", "acquire", 10, 11, node_id=2, cls="db", lease_id=6)
    b.ok("c", "validate", 12, 13, lease_id=5, live=False)
    assert b.check().ok


def test_partitions_split_tenants_and_keep_a_lease_with_its_calls() -> None:
    b = B()
    b.ok("a", "consume", 0, 1, node_id=4, resource="http", amount=1)  # tenant 2's caps
    b.ok("b", "consume", 0, 1, node_id=3, resource="http", amount=1)  # tenant 3's caps
    b.ok("a", "acquire", 0, 1, node_id=3, cls="db", lease_id=5)  # root limit: shared
    b.ok("a", "acquire", 0, 1, node_id=2, cls="db", lease_id=6)
    b.ok("c", "validate", 2, 3, lease_id=5, live=True)
    ops = b.h.ops
    parts = partitions(Model(TREE, ops), ops)
    assert sorted(sorted(op.id for op in p) for p in parts) == [[0], [1], [2, 3, 4]]
    assert b.check().ok


def test_the_search_bound_gives_unknown_not_ok() -> None:
    b = B()
    for i in range(12):
        b.unknown(f"c{i}", "consume", 0, node_id=4, resource="http", amount=1 + i % 3)
    b.ok("z", "consume", 100, 101, node_id=3, resource="http", amount=1)
    result = check(b.h, max_states=10)
    assert result.verdict == "unknown"
    assert "max_states=10" in result.explain()


def test_json_round_trip_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = B()
    b.ok("a", "acquire", 0, 10, node_id=2, cls="db", lease_id=5)
    b.unknown("b", "release", 11, lease_id=5)
    b.fail("c", "consume", 1, 2, "quota", node_id=4, resource="http", amount=99)
    path = tmp_path / "h.json"
    b.h.save(path)
    again = History.load(path)
    assert again.ops == b.h.ops and again.tree == b.h.tree
    assert main([str(path)]) == 0
    b.fail("d", "consume", 20, 21, "quota", node_id=4, resource="http", amount=1)
    b.h.save(path)
    assert main([str(path)]) == 1
    assert "denied for quota" in capsys.readouterr().out
    path.write_text("{")
    assert main([str(path)]) == 64
    assert "is not JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        main([str(path), "--max-states", "many"])
    assert bad.value.code == 64


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"format": "other"}, "format"),
        ({"ops": [{"call": "nap"}]}, "ops[0].call"),
        ({"tree": [{"id": 1, "parent": 9}]}, "tree"),
        ({"model": {"lease_expiry": "yes"}}, "model.lease_expiry"),
    ],
)
def test_bad_histories_name_the_field(patch: dict[str, Any], field: str) -> None:
    raw = {**B().h.to_json(), **patch}
    with pytest.raises(HistoryError) as err:
        History.from_json(json.loads(json.dumps(raw)))
    assert err.value.field == field


def test_bad_ops_name_the_field() -> None:
    good: dict[str, Any] = {
        "client": "a",
        "call": "acquire",
        "args": {"node_id": 2, "cls": "db"},
        "invoke_ns": 5,
        "complete_ns": 6,
        "outcome": "ok",
        "result": {"lease_id": 1},
    }
    cases: list[tuple[dict[str, Any], str]] = [
        ({"args": {"node_id": "2", "cls": "db"}}, "ops[0].args.node_id"),
        ({"result": {}}, "ops[0].result.lease_id"),
        ({"complete_ns": 4}, "ops[0].complete_ns"),
        ({"complete_ns": None}, "ops[0].complete_ns"),
        ({"outcome": "fail"}, "ops[0].result"),
        ({"extra": 1}, "ops[0].extra"),
    ]
    for patch, field in cases:
        raw = {**B().h.to_json(), "ops": [{**good, **patch}]}
        with pytest.raises(HistoryError) as err:
            History.from_json(raw)
        assert err.value.field == field, (patch, err.value)


def test_a_full_history_refuses_the_call() -> None:
    h = History(TREE, max_ops=1)
    h.invoke("a", "validate", {"lease_id": 1}, 0)
    with pytest.raises(HistoryFull):
        h.invoke("a", "validate", {"lease_id": 1}, 1)
    assert len(h) == 1


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 10), st.integers(1, 12)), max_size=12))
def test_the_fencing_sweep_matches_every_pair(grants: list[tuple[int, int, int]]) -> None:
    """The sweep reports a violation exactly when some real-time pair is out of id order
    (or an id repeats)."""
    b = B()
    for i, (inv, dur, gid) in enumerate(grants):
        b.ok(f"c{i}", "acquire", inv, inv + dur, node_id=3, cls="db", lease_id=gid)
    ops = b.h.ops
    ids = [op.result["lease_id"] for op in ops]
    bad = len(set(ids)) < len(ids) or any(
        (a.complete_ns or 0) < c.invoke_ns and ids[a.id] >= ids[c.id] for a in ops for c in ops
    )
    assert bool(check_fencing(ops)) is bad


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (Denied("x", "RESOURCE_EXHAUSTED", {"denial": {"reason": "quota"}}), ("fail", "quota")),
        (
            LeaseEnded("x", "FAILED_PRECONDITION", {"end": "session_expired"}),
            ("fail", "lease_ended"),
        ),
        (AcquireTimeout("x", "DEADLINE_EXCEEDED"), ("fail", "timeout")),
        (RequestError("x", "NOT_FOUND", {"reason": "not_found"}), ("fail", "not_found")),
        (Unavailable("x", "UNAVAILABLE"), ("unknown", "")),
        (SessionLost("x", "SESSION_LOST"), ("unknown", "")),
        (TimeoutError(), ("unknown", "")),
        (asyncio.CancelledError(), ("unknown", "")),
    ],
)
def test_sdk_errors_become_outcomes(exc: BaseException, outcome: tuple[str, str]) -> None:
    assert outcome_of(exc) == outcome


def test_a_truncated_closure_turns_a_violation_into_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from governor.testing.linearizability import _model

    b = B()
    for i in range(5):
        b.unknown(f"c{i}", "consume", 0, node_id=4, resource="http", amount=i + 1)
    b.ok("z", "consume", 10, 11, node_id=4, resource="http", amount=6)  # over the cap of 5
    assert b.check().verdict == "violation"
    monkeypatch.setattr(_model, "CLOSURE_STATES_MAX", 2)
    result = b.check()
    assert result.verdict == "unknown" and "CLOSURE_STATES_MAX" in result.explain()

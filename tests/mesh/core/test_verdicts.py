"""Verdicts users can act on: `limit` and `step` on every verdict, the detailed
form's `remaining`, `retry_after_ms` and `reset_after_ms` from each gate type's state, the
waiting form answering at once when waiting cannot help, and `stopped` after `stop()`.
Real cores on explicit clocks; no I/O."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mesh.core.verdict as verdict_module
from mesh import admit
from mesh.core.admission import DEADLINE, QUEUE_FULL, STOPPED, UNKNOWN, Admission, StrictGate
from mesh.core.gcra import NS_PER_S, Gcra, refill_ns
from mesh.core.messages import RateSnapshot, SnapshotBatch
from mesh.core.policy import BOUNDS, Mode
from mesh.core.reporter import GlobalGate, Reporter
from mesh.core.ring import Ring
from mesh.core.verdict import Reason, Step, Suspension, Verdict, ms_ceil, verdict
from tests.mesh._helpers import MS, cache, policy
from tests.mesh.core.test_strict_gate import Clock, primed, tick

T, M = "t", "read_iops"


def local(rate: int = 100, burst: int = 10, mode: str = "local", n_live: int = 1) -> Admission:
    return Admission(cache(policy(rate=rate, burst=burst, b=burst, mode=mode)), 0, n_live=n_live)


def fed_global(remaining: int, *, b: int = 20, rate: int = 1000, burst: int = 100) -> Admission:
    """A one-member mesh worker whose view of the key holds a fresh snapshot."""
    r = Reporter("w", 1, Ring(["w"], 1))
    p = policy(rate=rate, burst=burst, b=b)
    a = Admission(cache(p), 0, reporter=r)
    a.try_admit(T, M)  # opens the view (one bootstrap unit, reported below)
    r.flush(0)
    snap = RateSnapshot(p.rate_key, 1, 1, remaining, 0, 1, receiver_epoch=1)
    r.receive(0, SnapshotBatch.of("w", 1, (snap,)))
    return a


# -- limit and step on the shared verdicts --------------------------------------------------


@pytest.mark.parametrize(
    "build, step, limit",
    [
        (lambda: local(), Step.LOCAL, 100),
        (lambda: local(mode="share", n_live=2), Step.SHARE, 100),
        (lambda: fed_global(50), Step.MESH, 1000),
        (lambda: Admission(cache(policy(rate=7, enabled=False)), 0), Step.POLICY, None),
    ],
)
def test_shared_verdicts_carry_the_policy_limit_and_the_step(
    build: Callable[[], Admission], step: Step, limit: int | None
) -> None:
    a = build()
    v = a.try_admit(T, M)
    assert v.allowed and (v.step, v.limit) == (step, limit)
    assert (v.remaining, v.retry_after_ms, v.reset_after_ms) == (None, None, None)
    assert a.try_admit(T, M) is v  # shared: the hot path allocates nothing


def test_denials_name_the_step_that_denied() -> None:
    a = local(burst=1)
    a.try_admit(T, M)
    assert a.try_admit(T, M).step is Step.LOCAL
    big = a.try_admit(T, M, 2)
    assert (big.reason, big.step, big.limit) == (Reason.TOO_LARGE, Step.LOCAL, 100)
    assert (UNKNOWN.step, UNKNOWN.limit, UNKNOWN.suspended) == (
        Step.POLICY,
        None,
        Suspension.POLICY_UNKNOWN,
    )
    assert QUEUE_FULL.step is Step.QUEUE and DEADLINE.step is Step.QUEUE
    assert (STOPPED.reason, STOPPED.step, STOPPED.allowed) == (Reason.STOPPED, Step.STOPPED, False)
    no_mesh = Admission(cache(policy()), 0).try_admit(T, M)  # global, no reporter
    assert (no_mesh.step, no_mesh.suspended) == (Step.MESH, Suspension.OWNER_UNREACHABLE)
    no_credit = Admission(cache(policy(mode="strict")), 0).try_admit(T, M)
    assert no_credit.step is Step.STRICT and no_credit.limit == 1000


def test_strict_verdicts_say_which_step_denied() -> None:
    clock = Clock()
    m, g = primed(clock, 1_000, b=20)
    front = g.front
    assert front is not None
    ok = m.admission.try_admit(T, M)
    assert ok.allowed and ok.step is Step.STRICT and ok.mode is Mode.STRICT
    while m.admission.try_admit(T, M).allowed:
        pass
    veto = m.admission.try_admit(T, M)
    assert (veto.reason, veto.step, veto.limit) == (Reason.GLOBAL_LIMIT, Step.MESH, 1000)


def test_to_dict_is_json_ready() -> None:
    a = local()
    d = a.try_admit_detailed(T, M).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d == {
        "allowed": True,
        "reason": "admitted",
        "mode": "local",
        "bound": BOUNDS["local"],
        "suspended": None,
        "limit": 100,
        "step": "local",
        "remaining": 9,
        "retry_after_ms": 0,
        "reset_after_ms": 10,
    }
    assert UNKNOWN.to_dict()["suspended"] == "policy_unknown"
    assert STOPPED.to_dict()["retry_after_ms"] is None


# -- the numbers, per gate type ------------------------------------------------------------------


def test_local_numbers_follow_the_gcra() -> None:
    """rate 100/s, burst 10: one unit's emission interval is 10 ms."""
    a = local(rate=100, burst=10)
    seen = [a.try_admit_detailed(T, M, 3).remaining for _ in range(3)]
    assert seen == [7, 4, 1]  # remaining goes down by the amount
    v = a.try_admit_detailed(T, M, 3)
    assert (v.allowed, v.reason, v.remaining) == (False, Reason.RATE_LIMITED, 1)
    assert v.retry_after_ms == 20  # 2 units short, 10 ms each
    assert v.reset_after_ms == 90  # 9 units used, back at 10 ms each
    a.try_admit(T, M)  # drained
    v = a.try_admit_detailed(T, M, 1)
    assert (v.remaining, v.retry_after_ms, v.reset_after_ms) == (0, 10, 100)
    a.tick(10 * MS)  # one emission interval later, one unit is back
    assert a.try_admit_detailed(T, M, 1, now_ns=10 * MS).allowed
    a.tick(2000 * MS)  # idle long enough: full again
    v = a.try_admit_detailed(T, M, 1, now_ns=2000 * MS)
    assert (v.allowed, v.remaining, v.retry_after_ms, v.reset_after_ms) == (True, 9, 0, 10)
    a.tick(2010 * MS)
    a.try_admit(T, M)
    a.refund(T, M, 1)
    a.tick(2020 * MS)
    gate = a.gate(T, M)
    assert gate is not None
    assert gate.numbers(1, True, 2020 * MS).reset_after_ms == 0  # nothing owed: full


def test_share_numbers_use_this_workers_share_and_a_too_large_share_cannot_wait() -> None:
    a = local(rate=100, burst=10, mode="share", n_live=2)  # 50/s, burst 5 here
    v = a.try_admit_detailed(T, M, 5)
    assert (v.allowed, v.remaining, v.reset_after_ms) == (True, 0, 100)
    v = a.try_admit_detailed(T, M, 1)
    assert (v.step, v.retry_after_ms) == (Step.SHARE, 20)  # 1 unit at 50/s
    v = a.try_admit_detailed(T, M, 6)  # within B (10), past this worker's share (5)
    assert (v.reason, v.retry_after_ms) == (Reason.TOO_LARGE, None)


def test_too_large_and_unknown_and_fixed_views_say_waiting_cannot_help() -> None:
    a = local(burst=10)
    big = a.try_admit_detailed(T, M, 11)
    assert (big.reason, big.retry_after_ms, big.remaining) == (Reason.TOO_LARGE, None, 10)
    unknown = a.try_admit_detailed("nobody", M)
    assert unknown is UNKNOWN and unknown.retry_after_ms is None
    no_mesh = Admission(cache(policy()), 0).try_admit_detailed(T, M)
    assert (no_mesh.remaining, no_mesh.retry_after_ms) == (0, None)
    disabled = Admission(cache(policy(enabled=False)), 0).try_admit_detailed(T, M, 10**9)
    assert (disabled.allowed, disabled.remaining, disabled.retry_after_ms) == (True, None, 0)


def test_global_numbers_from_the_snapshot() -> None:
    """Remaining 50 of B=100 at R=1000/s, local cap b=20: the allowance is 20."""
    a = fed_global(50)
    gate = a.gate(T, M)
    assert isinstance(gate, GlobalGate)
    v = a.try_admit_detailed(T, M, 5)
    assert (v.allowed, v.step, v.limit, v.remaining) == (True, Step.MESH, 1000, gate.avail)
    assert v.retry_after_ms == 0
    # The owner's bucket as the snapshot showed it (50), less the 5 used since: 55 to
    # refill at 1 ms each.
    assert v.reset_after_ms == 55
    left = gate.avail
    assert a.try_admit_detailed(T, M, left).remaining == 0
    no = a.try_admit_detailed(T, M, 3)
    assert (no.reason, no.remaining, no.retry_after_ms) == (Reason.RATE_LIMITED, 0, 3)
    later = gate.numbers(1, True, 40 * MS)
    assert later.reset_after_ms is not None and later.reset_after_ms < v.reset_after_ms


def test_strict_numbers_from_the_credit_held() -> None:
    clock = Clock()
    m, g = primed(clock, 10, b=50)
    a = m.admission
    v = a.try_admit_detailed(T, M, 4)
    assert (v.allowed, v.step, v.remaining, v.retry_after_ms) == (True, Step.STRICT, 6, 0)
    assert v.reset_after_ms is None  # governord holds the bucket
    assert a.try_admit_detailed(T, M, 6).remaining == 0
    no = a.try_admit_detailed(T, M, 1)
    assert (no.reason, no.remaining) == (Reason.NO_CREDIT, 0)
    assert no.retry_after_ms is not None and no.retry_after_ms >= 1
    assert isinstance(a.gate(T, M), StrictGate)
    tick(m, clock)


# -- the property: the numbers agree with what admission then does --------------------------------


@settings(max_examples=150, deadline=None)
@given(
    rate=st.integers(1, 5000),
    burst=st.integers(1, 200),
    mode=st.sampled_from(["local", "share"]),
    n_live=st.integers(1, 4),
    steps=st.lists(
        st.tuples(st.integers(1, 250), st.integers(0, 40), st.booleans()), min_size=1, max_size=25
    ),
)
def test_numbers_are_consistent_with_what_is_then_admitted(
    rate: int, burst: int, mode: str, n_live: int, steps: list[tuple[int, int, bool]]
) -> None:
    """allowed => remaining >= 0 and retry_after_ms == 0; rate_limited => retry_after_ms > 0
    (or None past this view's burst); and after waiting retry_after_ms on the explicit
    clock, with a tick then, the same amount is admitted."""
    a = local(rate=rate, burst=burst, mode=mode, n_live=n_live)
    now = 0
    for amount, wait_ms, tick_first in steps:
        if tick_first:
            now += wait_ms * MS
            a.tick(now)
        v = a.try_admit_detailed(T, M, amount, now_ns=now)
        assert v.remaining is not None and v.remaining >= 0
        if v.allowed:
            assert v.retry_after_ms == 0
            continue
        if v.reason is Reason.TOO_LARGE:
            assert v.retry_after_ms is None
            continue
        assert v.reason is Reason.RATE_LIMITED
        if v.retry_after_ms is None:  # a share smaller than the amount: it never fits here
            gate = a.gate(T, M)
            assert gate is not None and amount > gate.meter.burst  # type: ignore[attr-defined]
            continue
        assert v.retry_after_ms > 0 and v.remaining < amount
        now += v.retry_after_ms * MS
        a.tick(now)
        assert a.try_admit(T, M, amount).allowed, (amount, v)


@settings(max_examples=100, deadline=None)
@given(
    remaining=st.integers(0, 100),
    amounts=st.lists(st.integers(1, 120), min_size=1, max_size=30),
    later_ms=st.integers(0, 50),
)
def test_global_numbers_are_consistent_with_the_decision(
    remaining: int, amounts: list[int], later_ms: int
) -> None:
    """A fresh global view: allowed => retry_after_ms 0 and remaining the view's `avail`;
    denied rate_limited => retry_after_ms >= 1 and at least the refill of the shortfall
    at R; too_large => None. reset_after_ms never grows as time passes."""
    a = fed_global(remaining)
    gate = a.gate(T, M)
    assert isinstance(gate, GlobalGate)
    for amount in amounts:
        before = max(gate.avail, 0)
        v = a.try_admit_detailed(T, M, amount)
        assert v.remaining == max(gate.avail, 0) and v.reset_after_ms is not None
        if v.allowed:
            assert v.retry_after_ms == 0 and v.remaining == before - amount
        elif v.reason is Reason.TOO_LARGE:
            assert v.retry_after_ms is None
        else:
            assert v.reason is Reason.RATE_LIMITED and v.retry_after_ms is not None
            assert v.retry_after_ms >= max(1, amount - before)  # R = 1000/s: 1 ms a unit
        later = gate.numbers(amount, v.allowed, later_ms * MS).reset_after_ms
        assert later is not None and later <= v.reset_after_ms


def test_reset_after_reaches_zero_when_idle_long_enough() -> None:
    a = local(rate=50, burst=20)
    for _ in range(20):
        a.try_admit(T, M)
    v = a.try_admit_detailed(T, M)
    assert v.reset_after_ms == 400  # 20 units at 20 ms each
    a.tick(400 * MS)
    full = a.try_admit_detailed(T, M, now_ns=400 * MS)
    assert full.allowed and full.remaining == 19 and full.reset_after_ms == 20
    gate = a.gate(T, M)
    assert gate is not None
    a.tick(420 * MS)
    assert gate.numbers(1, True, 420 * MS) == (20, 0, 0)
    assert NS_PER_S // 50 == 20 * MS  # the emission interval the figures above count in


# -- waiting forms and stop ------------------------------------------------------------------------


def test_the_waiting_form_returns_detailed_verdicts_and_policy_unknown_at_once() -> None:
    async def main() -> None:
        a = local(rate=100, burst=2)
        loop = asyncio.get_running_loop()
        ok = await admit(a, T, M, timeout_s=1)
        assert ok.allowed and ok.remaining == 1 and ok.retry_after_ms == 0
        t0 = loop.time()
        unknown = await admit(a, "nobody", M, timeout_s=5)
        big = await admit(a, T, M, 3, timeout_s=5)
        assert loop.time() - t0 < 0.5, "waiting cannot help: no wait"
        assert unknown.reason is Reason.POLICY_UNKNOWN
        assert unknown.suspended is Suspension.POLICY_UNKNOWN
        assert big.reason is Reason.TOO_LARGE and big.retry_after_ms is None
        a.try_admit(T, M)
        late = await admit(a, T, M, timeout_s=0.01)
        assert late.reason is Reason.DEADLINE_EXCEEDED and late.step is Step.QUEUE
        assert late.limit == 100 and late.retry_after_ms == 10 and late.remaining == 0

    asyncio.run(main())


def test_stop_answers_stopped_everywhere_and_resolves_queued_waiters() -> None:
    async def main() -> None:
        a = local(rate=1, burst=1)
        a.try_admit(T, M)
        waiting = asyncio.ensure_future(admit(a, T, M, timeout_s=30))
        await asyncio.sleep(0)
        assert len(a.queues) == 1
        resolved = a.stop()
        assert len(resolved) == 1 and len(a.queues) == 0
        assert await asyncio.wait_for(waiting, 1) is STOPPED
        assert a.try_admit(T, M) is STOPPED and a.charge(T, M, 5) is STOPPED
        assert a.try_admit("nobody", M) is STOPPED
        assert a.try_admit_detailed(T, M) is STOPPED
        assert await admit(a, T, M, timeout_s=5) is STOPPED
        assert a.deadline_verdict(T, M) is STOPPED
        a.refund(T, M, 1)  # a no-op, not an error
        a.tick(10 * MS)
        assert a.try_admit(T, M) is STOPPED

    asyncio.run(main())


# -- allocation, interning, counting --------------------------------------------------------------


def _grown(call: Callable[[], object], n: int = 20_000) -> int:
    call()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(n):
            call()
        return int(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()


def test_try_admit_allocates_nothing_on_any_shared_verdict() -> None:
    big = 10**12
    allowing = Admission(cache(policy(rate=big, burst=big, b=big, mode="local")), 0)
    denying = local(burst=1)
    denying.try_admit(T, M)
    glob = fed_global(50)
    while glob.try_admit(T, M).allowed:
        pass
    stopped = local()
    stopped.stop()
    m, _ = primed(Clock(), 10**9, b=10**6)  # strict: the inline spend from the fast block
    strict = m.admission
    for a in (allowing, denying, glob, stopped, strict):
        assert _grown(lambda a=a: a.try_admit(T, M)) < 1024  # type: ignore[misc]
    assert denying.try_admit(T, M).reason is Reason.RATE_LIMITED
    assert glob.try_admit(T, M).reason is Reason.RATE_LIMITED
    ok = strict.try_admit(T, M)
    assert ok.allowed and ok.step is Step.STRICT


def test_shared_is_the_interned_equivalent_and_interning_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = local()
    shared = a.try_admit(T, M)
    detailed = a.try_admit_detailed(T, M)
    assert detailed is not shared and detailed.shared() is shared
    assert detailed.remaining is not None and shared.remaining is None
    monkeypatch.setattr(verdict_module, "_with_limit", verdict_module.VERDICTS_INTERNED_MAX)
    fresh = verdict(True, Reason.ADMITTED, Mode.LOCAL, "b", limit=987_654_321, step=Step.LOCAL)
    again = verdict(True, Reason.ADMITTED, Mode.LOCAL, "b", limit=987_654_321, step=Step.LOCAL)
    assert fresh == again and fresh is not again  # past the bound: built, not kept
    counted = fresh.shared()
    assert counted.limit is None and counted is again.shared()  # counted without its limit
    assert isinstance(counted, Verdict)


def test_the_unit_helpers_round_waits_up() -> None:
    assert (ms_ceil(0), ms_ceil(-3), ms_ceil(1), ms_ceil(MS), ms_ceil(MS + 1)) == (0, 0, 1, 1, 2)
    assert refill_ns(3, 1000) == 3 * MS and refill_ns(1, 3) == 333_333_334
    assert refill_ns(-5, 10) == 0
    g = Gcra(10, 5, 0)
    c = g.copy()
    c.apply(0, 5)
    assert g.remaining(0) == 5 and c.remaining(0) == 0  # the copy is independent

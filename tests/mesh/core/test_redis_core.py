"""Redis mode's core (seed 002) with the in-memory counter: the breaker as a table, the
verdicts Redis gives and the embedded limiter's when it does not, hashed keys, the GCRA
step pinned to the mesh's own GCRA. No I/O: a manual clock, `MemoryCounter`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.core.admission import (
    REDIS_ASK,
    Admission,
    BreakerState,
    Cause,
    CounterOutcome,
    CounterReply,
    MemoryCounter,
    RedisDesk,
    RedisGate,
    gcra_step,
    parse_reply,
    redis_key,
)
from mesh.core.admission._breaker import (
    BREAKER_FAILURES,
    BREAKER_PROBE_NS,
    TRANSITIONS,
    Breaker,
    BreakerInput,
)
from mesh.core.admission._counter import NUMBER_MAX, US_PER_S
from mesh.core.gcra import Gcra
from mesh.core.policy import BOUNDS, Mode, RateKey, TenantRatePolicy
from mesh.core.verdict import Numbers, Reason, Step, Suspension, Verdict
from tests.mesh._helpers import MS, cache, policy

S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000 * S

    def __call__(self) -> int:
        return self.ns


def _setup(
    *policies: TenantRatePolicy,
) -> tuple[Admission, RedisDesk, MemoryCounter, Clock]:
    clock = Clock()
    desk = RedisDesk(clock)
    adm = Admission(cache(*policies), clock.ns, redis=desk)
    return adm, desk, MemoryCounter(clock), clock


def _decide(
    adm: Admission, counter: MemoryCounter, tenant: str = "t", amount: int = 1
) -> tuple[Verdict, Numbers | None]:
    v = adm.try_admit(tenant, "read_iops", amount)
    if v is not REDIS_ASK:
        return v, adm.numbers(v, tenant, "read_iops", amount)
    gate = adm.asked
    assert isinstance(gate, RedisGate) and adm.redis is not None
    return adm.redis.decide(gate, amount, counter)


# -- the breaker -------------------------------------------------------------------------


def test_every_state_and_input_has_a_transition() -> None:
    assert set(TRANSITIONS) == {(s, i) for s in BreakerState for i in BreakerInput}
    for (state, what), t in TRANSITIONS.items():
        is_call = what in (BreakerInput.CALL_EARLY, BreakerInput.CALL_DUE)
        assert (t.allow is not None) == is_call, (state, what)


# (what happens, at ms since the start) -> (state after, calls allowed so far is checked)
BREAKER_SCRIPT: list[tuple[str, int, BreakerState, bool | None]] = [
    # four failures leave it closed, a success resets the count
    *[("fail", 0, BreakerState.CLOSED, None)] * (BREAKER_FAILURES - 1),
    ("ok", 0, BreakerState.CLOSED, None),
    *[("fail", 10, BreakerState.CLOSED, None)] * (BREAKER_FAILURES - 1),
    ("fail", 10, BreakerState.OPEN, None),  # the fifth in a row opens it
    ("call", 11, BreakerState.OPEN, False),  # fails fast
    ("call", 10 + 4_999, BreakerState.OPEN, False),
    ("call", 10 + 5_000, BreakerState.HALF_OPEN, True),  # the probe
    ("call", 10 + 5_001, BreakerState.HALF_OPEN, False),  # only one probe at a time
    ("fail", 10 + 5_002, BreakerState.HALF_OPEN, None),  # a straggler's: the probe decides
    ("probe_fail", 10 + 5_003, BreakerState.OPEN, None),  # reopens, a new interval
    ("call", 10 + 9_000, BreakerState.OPEN, False),
    ("call", 10 + 10_003, BreakerState.HALF_OPEN, True),
    ("call", 10 + 15_003, BreakerState.HALF_OPEN, True),  # a probe that never reported
    ("probe_ok", 10 + 15_004, BreakerState.CLOSED, None),  # positive recovery
    ("call", 10 + 15_005, BreakerState.CLOSED, True),
]


def test_breaker_script() -> None:
    b = Breaker()
    for i, (what, at_ms, state, allowed) in enumerate(BREAKER_SCRIPT):
        now = at_ms * MS
        if what == "call":
            ok, _ = b.call(now)
            assert ok is allowed, i
        else:
            b.record(what.endswith("ok"), what.startswith("probe"), now)
        assert b.state is state, (i, what)
    assert (b.opened, b.closed) == (1, 1)


def test_a_late_good_answer_closes_an_open_breaker() -> None:
    b = Breaker()
    for _ in range(BREAKER_FAILURES):
        b.record(False, False, 0)
    assert b.state is BreakerState.OPEN
    b.record(True, False, MS)  # a call begun while closed answered: Redis is back
    assert b.state.value == "closed" and b.call(MS) == (True, False)


# -- the GCRA step ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    rate=st.integers(1, NUMBER_MAX),
    burst=st.integers(1, 10_000),
    steps=st.lists(st.tuples(st.integers(0, 5 * US_PER_S), st.integers(1, 10_000)), max_size=40),
)
def test_gcra_step_decides_as_the_mesh_gcra(
    rate: int, burst: int, steps: list[tuple[int, int]]
) -> None:
    """The script's arithmetic (microseconds, tat + rem/rate) takes exactly the admissions
    `mesh.core.gcra.Gcra` takes at the same instants: one formula, two renderings."""
    now_us = 1_700_000_000 * US_PER_S
    meter = Gcra(rate, burst, now_us * 1000)
    state = None
    for gap, amount in steps:
        now_us += gap
        amount = min(amount, burst)
        new, reply = gcra_step(state, now_us, rate, burst, amount)
        assert reply.allowed == meter.try_take(now_us * 1000, amount)
        assert reply.remaining == meter.remaining(now_us * 1000)
        if new is not None:
            state = new


@settings(max_examples=100, deadline=None)
@given(
    rate=st.integers(1, 5_000),
    burst=st.integers(1, 500),
    gaps=st.lists(st.integers(0, 20_000), min_size=1, max_size=300),
)
def test_memory_counter_never_admits_past_the_allowance(
    rate: int, burst: int, gaps: list[int]
) -> None:
    clock = Clock()
    counter = MemoryCounter(clock)
    start, admitted = clock.ns, 0
    for gap in gaps:
        clock.ns += gap * 1000
        admitted += counter.step("k", rate, burst, 1).allowed
    elapsed_s = (clock.ns - start) / S
    assert admitted <= burst + rate * elapsed_s


REPLIES = [
    ([1, 5, 0, 10], CounterReply(CounterOutcome.OK, True, 5, 0, 10)),
    ([0, 0, 3, 9], CounterReply(CounterOutcome.OK, False, 0, 3, 9)),
    ((1, 0, 0, 0), CounterReply(CounterOutcome.OK, True, 0, 0, 0)),
]
MALFORMED: list[object] = [
    None,
    b"OK",
    [1, 2, 3],
    [1, 2, 3, 4, 5],
    [2, 0, 0, 0],
    [1, -1, 0, 0],
    [1, 101, 0, 0],
]
MALFORMED += [[1, 0, -1, 0], [1, 0, 0, -5], [1, "0", 0, 0], [True, 0, 0, 0], [1.0, 0, 0, 0]]


@pytest.mark.parametrize("raw,want", REPLIES)
def test_parse_reply(raw: object, want: CounterReply) -> None:
    assert parse_reply(raw, 100) == want


@pytest.mark.parametrize("raw", MALFORMED)
def test_malformed_replies_are_an_outcome(raw: object) -> None:
    assert parse_reply(raw, 100).outcome is CounterOutcome.REPLY_MALFORMED


# -- keys -------------------------------------------------------------------------------


def test_keys_hash_the_scope_and_keep_tenant_ids_out() -> None:
    k = redis_key(RateKey("acme-corp", "read_iops", 3))
    assert k.startswith("rm:gcra:") and len(k) == len("rm:gcra:") + 32
    assert "acme" not in k and "read_iops" not in k
    assert k != redis_key(RateKey("acme-corp", "read_iops", 4))  # a generation: a bucket
    assert k != redis_key(RateKey("acme-corp", "write_iops", 3))
    assert k == redis_key(RateKey("acme-corp", "read_iops", 3))  # every process agrees
    adm, _, counter, _ = _setup(policy("acme-corp", mode="redis"), policy("*", mode="redis"))
    for tenant in ("acme-corp", "globex", "initech"):
        _decide(adm, counter, tenant)
    assert len(counter.keys) == 3
    assert not any(t in k for k in counter.keys for t in ("acme", "globex", "initech"))


# -- verdicts ---------------------------------------------------------------------------


def test_redis_decides_exactly_with_its_numbers() -> None:
    adm, desk, counter, clock = _setup(policy(rate=100, burst=10, mode="redis"))
    answers = [_decide(adm, counter) for _ in range(12)]
    assert [v.allowed for v, _ in answers] == [True] * 10 + [False] * 2
    ok, n = answers[0]
    assert (ok.mode, ok.bound, ok.suspended, ok.step) == (
        Mode.REDIS,
        BOUNDS["redis"],
        None,
        Step.REDIS,
    )
    assert ok.bound == "exact;redis_unreachable=>fleet<=N*limit"
    assert n == Numbers(9, 0, 10)
    no, n = answers[-1]
    assert no.reason is Reason.RATE_LIMITED and no.step is Step.REDIS
    assert n == Numbers(0, 10, 100)
    assert desk.answered == 12 and counter.steps == 12
    clock.ns += 10 * MS  # one unit refilled
    assert _decide(adm, counter)[0].allowed


@pytest.mark.parametrize(
    "outcome,cause",
    [
        (CounterOutcome.DEADLINE_EXCEEDED, Cause.DEADLINE_EXCEEDED),
        (CounterOutcome.CONNECT_FAILED, Cause.CONNECT_FAILED),
        (CounterOutcome.EVAL_ERROR, Cause.EVAL_ERROR),
        (CounterOutcome.REPLY_MALFORMED, Cause.REPLY_MALFORMED),
    ],
)
def test_every_failure_falls_back_disclosed_then_the_breaker_opens(
    outcome: CounterOutcome, cause: Cause
) -> None:
    adm, desk, counter, clock = _setup(policy(rate=100, burst=10, mode="redis"))
    counter.fail = outcome
    answers = [_decide(adm, counter) for _ in range(15)]
    for v, _ in answers:
        assert v.suspended is Suspension.REDIS_UNREACHABLE
        assert v.bound == BOUNDS["redis_unreachable"] == "redis_unreachable:fleet<=N*limit"
        assert v.mode is Mode.REDIS and v.step is Step.LOCAL
    # the embedded limiter: the whole limit in this process
    assert [v.allowed for v, _ in answers] == [True] * 10 + [False] * 5
    assert answers[0][1] == Numbers(9, 0, 10)
    assert counter.steps == BREAKER_FAILURES  # then it fails fast, no round trip
    assert desk.breaker.state is BreakerState.OPEN
    assert desk.fallbacks[cause] == BREAKER_FAILURES
    assert desk.fallbacks[Cause.BREAKER_OPEN] == 15 - BREAKER_FAILURES
    assert desk.last_error and desk.health()["breaker"] == "open"
    # positive recovery: after the probe interval one call probes, a good answer closes it
    counter.fail = None
    clock.ns += BREAKER_PROBE_NS
    v, _ = _decide(adm, counter)
    assert v.step is Step.REDIS and v.suspended is None
    assert desk.breaker.state.value == "closed" and counter.steps == BREAKER_FAILURES + 1


def test_the_embedded_limiter_hears_what_redis_admitted() -> None:
    adm, _, counter, _ = _setup(policy(rate=100, burst=10, mode="redis"))
    for _ in range(8):
        assert _decide(adm, counter)[0].allowed
    counter.fail = CounterOutcome.CONNECT_FAILED
    answers = [_decide(adm, counter)[0].allowed for _ in range(4)]
    assert answers == [True, True, False, False]  # 8 + 2: the whole limit, not 10 more


def test_too_large_needs_no_round_trip_and_refund_changes_nothing() -> None:
    adm, _, counter, _ = _setup(policy(rate=100, burst=10, mode="redis"))
    v, n = _decide(adm, counter, amount=11)
    assert v.reason is Reason.TOO_LARGE and counter.steps == 0
    assert n is not None and n.retry_after_ms is None
    assert _decide(adm, counter, amount=10)[0].allowed
    adm.refund("t", "read_iops", 10)  # acquire-only: what Redis admitted stays spent
    assert not _decide(adm, counter)[0].allowed


def test_sub_unit_rates_meter_in_sub_units() -> None:
    p = TenantRatePolicy("t", "read_iops", 1, "300/minute", 5, 5, mode=Mode.REDIS)  # type: ignore[arg-type]
    adm, _, counter, clock = _setup(p)
    assert [_decide(adm, counter)[0].allowed for _ in range(6)] == [True] * 5 + [False]
    clock.ns += 200 * MS  # one unit is 0.2 s at 300/minute
    v, n = _decide(adm, counter)
    assert v.allowed and n is not None and n.remaining == 0


def test_numbers_out_of_the_scripts_range_fall_back_without_asking() -> None:
    adm, desk, counter, _ = _setup(policy(rate=NUMBER_MAX + 1, burst=10, mode="redis"))
    v, _ = _decide(adm, counter)
    assert v.allowed and v.suspended is Suspension.REDIS_UNREACHABLE
    assert counter.steps == 0 and desk.fallbacks[Cause.OUT_OF_RANGE] == 1
    assert desk.breaker.state is BreakerState.CLOSED


def test_without_a_tier_each_process_enforces_alone_disclosed() -> None:
    """No shared_state.redis: nothing dials (no desk), the local view answers on the fast
    path, and every verdict says redis_unreachable."""
    adm = Admission(cache(policy(rate=100, burst=10, mode="redis")), 0)
    answers = [adm.try_admit("t", "read_iops") for _ in range(11)]
    assert [v.allowed for v in answers] == [True] * 10 + [False]
    assert all(v.suspended is Suspension.REDIS_UNREACHABLE for v in answers)
    assert all(v is not REDIS_ASK for v in answers)


def test_idle_redis_views_are_forgotten_once_their_limiter_is_full() -> None:
    adm, _, counter, clock = _setup(policy(rate=100, burst=10, mode="redis"))
    _decide(adm, counter)
    assert adm.evict_idle() == 0  # its limiter heard one admission
    clock.ns += S
    adm.tick(clock.ns)
    assert adm.evict_idle() == 1

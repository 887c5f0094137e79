"""Strict mode's gate (front-running, DESIGN.md 1): the mesh vetoes first without touching
credit, credit admits second, a credit denial leaves the mesh's view exactly as it was, and
a block past its local expiry with governord silent fails closed (`governor_unreachable`).
Real cores joined by hand: the tests play governord's part with values, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mesh.core.admission import STRICT_BOUND, Admission, CreditDesk, StrictGate
from mesh.core.effects import Effect, ReserveCredit, ReturnCredit, Send
from mesh.core.member import Member
from mesh.core.policy import BOUNDS, Mode
from mesh.core.reporter import GlobalGate
from mesh.core.ring import Ring
from mesh.core.verdict import Reason, Suspension, Verdict
from mesh.errors import ConfigTypeError
from ratemesh.credit import CreditConfig, local_expiry_ms
from tests.mesh._helpers import MS, cache, policy

TTL_MS = 1_000


class Clock:
    """A manual monotonic clock in nanoseconds: the desk's only time source."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def ms(self, ms: int) -> None:
        self.ns += ms * MS


def member(clock: Clock, b: int = 20, **cfg: int) -> Member:
    desk = CreditDesk(clock, CreditConfig(**cfg))
    p = policy(rate=1000, burst=100, b=b, mode="strict")
    return Member("w", 1, Ring(["w"], 1), cache(p), 0, credit=desk)


def tick(m: Member, clock: Clock) -> list[Effect]:
    """A sync interval of a one-member mesh: its reports reach itself (the owner), so its
    view stays fresh; the credit effects are returned."""
    effects = m.tick(clock.ns)
    while any(isinstance(e, Send) for e in effects):
        out = []
        for e in effects:
            if isinstance(e, Send):
                out += m.deliver(clock.ns, e.message)
            else:
                out.append(e)
        effects = out
    return effects


def gate(m: Member) -> StrictGate:
    g = m.admission.gate("t", "read_iops")
    assert isinstance(g, StrictGate)
    return g


def reserves(m: Member) -> list[ReserveCredit]:
    assert m.credit is not None
    return [e for e in m.credit.take() if isinstance(e, ReserveCredit)]


def grant(m: Member, request: ReserveCredit, block_id: int, units: int) -> None:
    assert m.credit is not None
    m.credit.granted(request, block_id, units, TTL_MS)


def front_state(g: GlobalGate) -> tuple[int, int, int, bool]:
    return (g.avail, g.pending, g.denied, g.marked)


def primed(clock: Clock, units: int, b: int = 20) -> tuple[Member, StrictGate]:
    """A member whose strict gate holds one block of `units` (its first ask granted)."""
    m = member(clock, b=b)
    v = m.admission.try_admit("t", "read_iops")
    assert (v.allowed, v.reason) == (False, Reason.NO_CREDIT)
    (ask,) = reserves(m)
    grant(m, ask, 1, units)
    return m, gate(m)


def test_credit_denies_first_use_asks_for_a_block_and_the_verdict_says_no_credit() -> None:
    clock = Clock()
    m = member(clock)
    v = m.admission.try_admit("t", "read_iops")
    assert (v.allowed, v.reason, v.mode, v.bound) == (
        False,
        Reason.NO_CREDIT,
        Mode.STRICT,
        STRICT_BOUND,
    )
    assert v.suspended is None and STRICT_BOUND == BOUNDS["strict"]
    assert STRICT_BOUND == "admitted<=R*(t1-t0)+B;governor_unreachable=>fail_closed"
    (ask,) = reserves(m)
    assert ask.rate_key == policy(mode="strict").rate_key and ask.request.sent_at_ms == 0
    # One reserve at a time: denials while it is in flight ask for nothing more.
    assert not m.admission.try_admit("t", "read_iops").allowed
    assert reserves(m) == []
    grant(m, ask, 7, 5)
    v = m.admission.try_admit("t", "read_iops")
    assert (v.allowed, v.reason, v.bound) == (True, Reason.ADMITTED, STRICT_BOUND)


def test_the_mesh_vetoes_first_and_credit_is_not_touched() -> None:
    clock = Clock()
    m, g = primed(clock, 1_000, b=20)
    front = g.front
    assert front is not None
    room = front.avail
    assert 0 < room < 1_000
    admitted = sum(m.admission.try_admit("t", "read_iops").allowed for _ in range(room))
    assert admitted == room and g.holder.held(0) == 1_000 - room
    asked = m.credit.reserves if m.credit else -1
    for _ in range(50):
        v = m.admission.try_admit("t", "read_iops")
        assert (v.allowed, v.reason, v.mode, v.bound) == (
            False,
            Reason.GLOBAL_LIMIT,
            Mode.STRICT,
            STRICT_BOUND,
        )
    # Vetoed: not a unit of credit spent, no reserve asked; the owner hears the demand.
    assert g.holder.held(0) == 1_000 - room
    assert m.credit is not None and m.credit.reserves == asked and reserves(m) == []
    assert front.denied == 50 and m.credit.vetoed == 50 and m.credit.admitted == room


def test_a_credit_denial_refunds_the_mesh_charge_exactly() -> None:
    clock = Clock()
    m, g = primed(clock, 3, b=20)
    front = g.front
    assert front is not None
    for _ in range(3):
        assert m.admission.try_admit("t", "read_iops").allowed
    assert front.pending == 3  # the mesh was charged for what credit admitted
    before = front_state(front)
    for amount in (5, 2, 1):
        v = m.admission.try_admit("t", "read_iops", amount)
        assert (v.allowed, v.reason) == (False, Reason.NO_CREDIT)
        assert front_state(front) == before  # not a unit charged, denied, or marked
    assert m.credit is not None
    assert m.credit.credit_denied == 1 + 8  # and the first use, before any block
    (ask,) = reserves(m)
    assert ask.request.units >= 5  # sized for the denied amount at least


def test_past_its_local_expiry_with_governord_silent_the_gate_fails_closed() -> None:
    clock = Clock()
    cfg = CreditConfig()
    m, g = primed(clock, 100)
    for _ in range(4):  # demand enough to be refilled ahead (`CreditHolder.refill`)
        assert m.admission.try_admit("t", "read_iops").allowed
    expiry = local_expiry_ms(0, TTL_MS, cfg.rho_ppm, cfg.epsilon_ms)
    clock.ms(expiry - 1)
    effects = tick(m, clock)  # a refill goes out ahead of the expiry (lead_ms)
    assert m.admission.try_admit("t", "read_iops").allowed  # the last local millisecond
    clock.ms(1)
    effects += tick(m, clock)
    v = m.admission.try_admit("t", "read_iops")
    assert (v.allowed, v.reason) == (False, Reason.NO_CREDIT)  # a reserve is in flight
    effects += m.credit.take() if m.credit else []
    (ask,) = [e for e in effects if isinstance(e, ReserveCredit)]
    assert ask.request.sent_at_ms == expiry - 1
    clock.ms(cfg.unreachable_after_ms)  # governord does not answer
    tick(m, clock)
    v = m.admission.try_admit("t", "read_iops")
    assert (v.allowed, v.reason, v.suspended, v.bound) == (
        False,
        Reason.GOVERNOR_UNREACHABLE,
        Suspension.GOVERNOR_UNREACHABLE,
        STRICT_BOUND,
    )
    assert m.credit is not None
    m.credit.failed(ask, unreachable=True)  # the driver gave up on the call
    assert m.admission.try_admit("t", "read_iops").reason is Reason.GOVERNOR_UNREACHABLE
    assert g.no.suspended is Suspension.GOVERNOR_UNREACHABLE  # what /health shows
    # It asks again after UNREACHABLE_RETRY_MS; once granted, it admits again.
    clock.ms(500)
    (again,) = [e for e in tick(m, clock) if isinstance(e, ReserveCredit)]
    grant(m, again, 2, 10)
    assert m.admission.try_admit("t", "read_iops").allowed


def test_a_reply_after_the_blocks_local_expiry_is_never_spent_and_goes_back() -> None:
    clock = Clock()
    m = member(clock)
    m.admission.try_admit("t", "read_iops")
    (ask,) = reserves(m)
    clock.ms(TTL_MS)  # the reply comes later than the block's local life
    grant(m, ask, 3, 50)
    assert not m.admission.try_admit("t", "read_iops").allowed
    back = [e for e in tick(m, clock) if isinstance(e, ReturnCredit)]
    assert ReturnCredit(ask.rate_key, 3, 50) in back


def test_a_block_for_a_gate_that_is_gone_goes_back_whole() -> None:
    clock = Clock()
    m = member(clock)
    m.admission.try_admit("t", "read_iops")
    (ask,) = reserves(m)
    m.policies.put(policy(rate=1000, burst=100, mode="strict", gen=2))  # a new generation
    tick(m, clock)
    assert m.credit is not None
    m.credit.granted(ask, 4, 30, TTL_MS)
    assert m.credit.take() == [ReturnCredit(ask.rate_key, 4, 30)]


def test_idle_spent_out_and_leaving_blocks_are_returned() -> None:
    clock = Clock()
    m, g = primed(clock, 2)
    assert m.credit is not None
    for _ in range(2):
        assert m.admission.try_admit("t", "read_iops").allowed
    back = [e for e in tick(m, clock) if isinstance(e, ReturnCredit)]
    assert back == [ReturnCredit(g.key, 1, 0)]  # spent out: governord stops counting it
    m2, g2 = primed(Clock(), 40)
    assert m2.credit is not None
    assert m2.admission.try_admit("t", "read_iops").allowed
    assert m2.credit.leave() == [ReturnCredit(g2.key, 1, 39)]
    assert not m2.admission.try_admit("t", "read_iops").allowed
    assert m2.credit.take() == []  # leaving: nothing more is asked for


def test_a_tick_read_before_a_later_admit_still_gives_back_and_never_raises() -> None:
    """A node reads the tick's instant before it takes its lock; an app thread may admit
    in between at a later instant. The tick then acts at the later one (it crashed the
    node's tick task once: the holder refuses time going back)."""
    clock = Clock()
    m, g = primed(clock, 2)
    read_by_tick = clock.ns
    clock.ms(5)
    for _ in range(2):
        assert m.admission.try_admit("t", "read_iops").allowed  # the holder is now at 5 ms
    back = [e for e in m.tick(read_by_tick) if isinstance(e, ReturnCredit)]
    assert back == [ReturnCredit(g.key, 1, 0)]


def test_refund_gives_back_the_mesh_charge_not_the_credit() -> None:
    clock = Clock()
    m, g = primed(clock, 10)
    front = g.front
    assert front is not None
    assert m.admission.try_admit("t", "read_iops", 4).allowed
    before = front.pending
    m.admission.refund("t", "read_iops", 3)
    assert front.pending == before - 3 and g.holder.held(0) == 6


def test_without_a_credit_desk_strict_still_fails_closed() -> None:
    a = Admission(cache(policy(mode="strict")), 0)
    v = a.try_admit("t", "read_iops")
    assert (v.reason, v.suspended) == (Reason.GOVERNOR_UNREACHABLE, Suspension.GOVERNOR_UNREACHABLE)
    with pytest.raises(ConfigTypeError) as info:
        Admission(cache(policy(mode="strict")), 0, credit=object())  # type: ignore[arg-type]
    assert info.value.field == "credit"


def test_without_a_mesh_credit_alone_decides() -> None:
    clock = Clock()
    desk = CreditDesk(clock)
    a = Admission(cache(policy(mode="strict")), 0, credit=desk)
    assert a.try_admit("t", "read_iops").reason is Reason.NO_CREDIT
    (ask,) = [e for e in desk.take() if isinstance(e, ReserveCredit)]
    desk.granted(ask, 1, 2, TTL_MS)
    assert [a.try_admit("t", "read_iops").allowed for _ in range(3)] == [True, True, False]


def test_a_waiter_at_its_deadline_hears_that_governord_is_unreachable() -> None:
    clock = Clock()
    m = member(clock)
    a = m.admission
    got: list[Verdict] = []
    assert a.try_admit("t", "read_iops").reason is Reason.NO_CREDIT
    (ask,) = reserves(m)
    assert a.enqueue("t", "read_iops", 1, 100 * MS, got.append) is not None
    clock.ms(50)
    tick(m, clock)
    assert got == []  # still waiting for credit
    assert m.credit is not None
    m.credit.failed(ask, unreachable=True)
    clock.ms(50)
    tick(m, clock)
    (v,) = got
    assert (v.allowed, v.reason, v.mode, v.bound, v.suspended) == (
        False,
        Reason.DEADLINE_EXCEEDED,
        Mode.STRICT,
        STRICT_BOUND,
        Suspension.GOVERNOR_UNREACHABLE,
    )


def test_a_waiter_is_admitted_when_its_credit_arrives() -> None:
    clock = Clock()
    m = member(clock)
    a = m.admission
    got: list[Verdict] = []
    a.try_admit("t", "read_iops")
    (ask,) = reserves(m)
    a.enqueue("t", "read_iops", 3, 100 * MS, got.append)
    grant(m, ask, 1, 10)
    a.service(clock.ns)  # the node serves the queues when a block arrives
    assert [v.allowed for v in got] == [True]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(1, 8)),
        st.tuples(st.just("wait"), st.integers(1, 400)),
        st.tuples(st.just("tick"), st.just(0)),
        st.tuples(st.just("grant"), st.integers(1, 60)),
        st.tuples(st.just("deny"), st.booleans()),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_each_step_does_only_its_part_on_random_runs(ops: list[tuple[str, object]]) -> None:
    """Random admits, waits, ticks, grants and failures: a veto touches no credit and asks
    nothing; a credit denial leaves the mesh's view as it was; an admission spends from a
    block granted and not past its local expiry; units admitted never exceed units granted."""
    clock = Clock()
    m = member(clock, b=10, horizon_ms=100)
    a, desk = m.admission, m.credit
    assert desk is not None
    cfg = desk.config
    asks: list[ReserveCredit] = []
    granted: list[tuple[int, int]] = []  # (units, local expiry ms)
    admitted = next_block = 0
    for op, arg in ops:
        if op == "admit":
            assert isinstance(arg, int)
            g = a.gate("t", "read_iops")
            front = g.front if isinstance(g, StrictGate) else None
            before = front_state(front) if front is not None else None
            held = g.holder.held(clock.ns // MS) if isinstance(g, StrictGate) else 0
            asked = desk.reserves
            v = a.try_admit("t", "read_iops", arg)
            assert v.bound == STRICT_BOUND and v.mode is Mode.STRICT
            g = a.gate("t", "read_iops")
            assert isinstance(g, StrictGate)
            if v.reason is Reason.GLOBAL_LIMIT:
                assert g.holder.held(clock.ns // MS) == held and desk.reserves == asked
            elif not v.allowed and before is not None and g.front is not None:
                assert front_state(g.front)[:3] == before[:3]
            if v.allowed:
                admitted += arg
                now_ms = clock.ns // MS
                assert any(exp > now_ms for _, exp in granted)
        elif op == "wait":
            assert isinstance(arg, int)
            clock.ms(arg)
        elif op == "tick":
            tick(m, clock)
        elif op in ("grant", "deny"):
            asks += [e for e in desk.take() if isinstance(e, ReserveCredit)]
            if not asks:
                continue
            ask = asks.pop(0)
            if op == "grant":
                assert isinstance(arg, int)
                next_block += 1
                desk.granted(ask, next_block, arg, TTL_MS)
                r = ask.request
                expiry = local_expiry_ms(r.sent_at_ms, TTL_MS, cfg.rho_ppm, cfg.epsilon_ms)
                granted.append((arg, expiry))
            else:
                desk.failed(ask, unreachable=bool(arg))
        assert admitted <= sum(units for units, _ in granted)
        assert desk.admitted == admitted


_ADMIT = st.tuples(st.just("admit"), st.integers(1, 12))
_WAIT_NS = st.tuples(st.just("wait_ns"), st.integers(0, 3 * MS))  # within and across ms
PIN_OPS = st.lists(
    st.one_of(
        _ADMIT,
        _ADMIT,
        _ADMIT,
        _WAIT_NS,
        _WAIT_NS,
        st.tuples(st.just("wait"), st.integers(1, 700)),  # ms: up to past a block's life
        st.tuples(st.just("tick"), st.just(0)),
        st.tuples(st.just("held"), st.just(0)),  # /health's read (drops expired blocks)
        st.tuples(st.just("grant"), st.integers(1, 40)),
        st.tuples(st.just("short"), st.integers(1, 40)),  # a block with a shorter life
        st.tuples(st.just("deny"), st.booleans()),
    ),
    min_size=20,
    max_size=150,
)


def _twin(clock: Clock) -> tuple[CreditDesk, Admission, StrictGate]:
    """A worker's desk and admission with no mesh, its strict gate opened by a first
    admission (denied: no credit yet; it asks)."""
    desk = CreditDesk(clock, CreditConfig(rho_ppm=0, epsilon_ms=0, idle_ms=300, lead_ms=50))
    a = Admission(cache(policy(mode="strict", burst=10**6)), 0, credit=desk)
    assert a.try_admit("t", "read_iops").reason is Reason.NO_CREDIT
    g = a.gate("t", "read_iops")
    assert isinstance(g, StrictGate)
    return desk, a, g


def _state(desk: CreditDesk, g: StrictGate) -> object:
    g.flush()  # what a tick does first: the holder then knows every spend
    h = g.holder
    return (
        {b.block_id: (b.left, b.expires_at_ms) for b in h.blocks.values()},
        list(h._demand),
        h._last_want_ms,
        h.in_flight,
        h.unreachable,
        g.no,
        g.loop.retry_at_ms,
        desk.admitted,
        desk.credit_denied,
        desk.reserves,
        desk.returns,
    )


@settings(max_examples=300, deadline=None)
@given(PIN_OPS, st.booleans())
def test_the_gates_inline_spend_answers_as_the_holders_try_spend(
    ops: list[tuple[str, int]], leave_midway: bool
) -> None:
    """STYLE.md "One formula, one place": the gate spends from the holder's fast block by
    itself ("while now < until and the units are left") and tells the holder once per
    millisecond. A twin gate sent through `CreditHolder.try_spend` on every admission (its
    fast block forgotten each time) must give the same verdicts, take the same units from
    the same blocks, ask and return the same, and leave the holder the same demand."""
    clock = Clock()
    fast_desk, fast_adm, fast = _twin(clock)
    ref_desk, _, ref = _twin(clock)
    twins = ((fast_desk, fast), (ref_desk, ref))
    next_block = 0
    asks: list[list[ReserveCredit]] = [[], []]
    if leave_midway:  # the worker leaves two thirds in: it gives back and asks no more
        ops.insert(len(ops) * 2 // 3, ("leave", 0))
    for op, arg in ops:
        if op == "admit":
            inline = clock.ns < fast.until_ns and arg <= fast.block.left
            same_ms = inline and clock.ns < fast.batch_end_ns
            event("in try_admit" if same_ms else "in admit" if inline else "through the holder")
            held = None if inline else fast.holder.held(clock.ns // MS)
            ref.forget_fast()  # its every admission goes through `CreditHolder.try_spend`
            got = fast_adm.try_admit("t", "read_iops", arg), ref.admit(arg)
            assert got[0] is got[1] or (got[0].allowed, got[0].reason) == (
                got[1].allowed,
                got[1].reason,
            )
            if held is not None and got[0].allowed:
                assert fast.holder.held(clock.ns // MS) == held - arg
        elif op == "wait_ns":
            clock.ns += arg
        elif op == "wait":
            clock.ms(arg)
        elif op == "tick":
            for desk, _ in twins:
                desk.tick(clock.ns)
        elif op == "held":
            for _, g in twins:
                g.holder.held(clock.ns // MS)
        elif op == "leave":
            for desk, _ in twins:
                desk.leave()
        else:
            for i, (desk, _) in enumerate(twins):
                asks[i] += [e for e in desk.take() if isinstance(e, ReserveCredit)]
            if not asks[0] or not asks[1]:
                continue
            pair = asks[0].pop(0), asks[1].pop(0)
            assert pair[0].request == pair[1].request
            next_block += 1
            for (desk, _), ask in zip(twins, pair, strict=True):
                if op == "deny":
                    desk.failed(ask, unreachable=bool(arg))
                else:  # "short": a later block that expires before the ones held
                    desk.granted(ask, next_block, arg, TTL_MS if op == "grant" else 50)
        for i, (desk, _) in enumerate(twins):
            asks[i] += [e for e in desk.take() if isinstance(e, ReserveCredit)]
        assert asks[0] == asks[1]
        assert _state(fast_desk, fast) == _state(ref_desk, ref)


def test_a_kept_block_reference_spends_nothing_returned_or_expired() -> None:
    """The gate keeps the holder's block object between spends: the holder zeroes a block
    it returns, and a block at its local expiry is at the gate's `until`, so a kept
    reference never spends units returned, nor any past the block's local expiry."""
    clock = Clock()
    desk, a, g = _twin(clock)
    (ask,) = [e for e in desk.take() if isinstance(e, ReserveCredit)]
    desk.granted(ask, 1, 10, TTL_MS)
    assert a.try_admit("t", "read_iops").allowed and a.try_admit("t", "read_iops").allowed
    kept = g.block
    assert kept.left == 8 and desk.admitted == 2
    desk.leave()
    assert kept.left == 0 and not a.try_admit("t", "read_iops").allowed
    assert desk.admitted == 2  # a return is not a spend
    clock2 = Clock()
    desk2, a2, g2 = _twin(clock2)
    (ask2,) = [e for e in desk2.take() if isinstance(e, ReserveCredit)]
    desk2.granted(ask2, 2, 10, TTL_MS)
    assert a2.try_admit("t", "read_iops").allowed
    kept2 = g2.block
    clock2.ms(TTL_MS - 1)
    assert a2.try_admit("t", "read_iops").allowed  # its last local millisecond
    clock2.ms(1)  # its local expiry (rho 0, epsilon 0: exactly the ttl)
    assert not a2.try_admit("t", "read_iops").allowed and 2 not in g2.holder.blocks
    assert kept2.left == 8 and desk2.admitted == 2

"""Strict mode: the mesh's global view vetoes first, then a governord credit block admits.

DESIGN.md section 1 ("front-running"). The mesh's view of the key (cheap, eventual) is asked
first and can only say no, so a noisy tenant is turned away locally and its demand never
reaches governord. What it passes is spent from the credit blocks a `ratemesh.credit`
holder keeps. The view is charged only once credit has admitted: that is the refund of the
mesh charge when credit denies, made before anything could see the charge, so the mesh
counts exactly the units admitted. The strict bound comes from the credit alone
(docs/strict.md); the veto can only lower what is admitted.

Sans-I/O: the desk reads time through the clock it is given and asks its driver for credit
with `ReserveCredit` / `ReturnCredit` effects; the driver answers `granted` or `failed`. When
to ask and how long to back off is `ratemesh.creditloop.CreditLoop`'s, one per gate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mesh.core.admission._gates import FixedGate
from mesh.core.effects import Effect, ReserveCredit, ReturnCredit
from mesh.core.gate import NEVER, Gate
from mesh.core.policy import BOUNDS, Mode, RateKey, TenantRatePolicy
from mesh.core.reporter import GlobalGate
from mesh.core.verdict import Numbers, Reason, Step, Suspension, Verdict, verdict
from ratemesh.credit import GOVERNOR_UNREACHABLE, CreditConfig, HeldBlock, Reserve
from ratemesh.creditloop import CreditLoop
from ratemesh.errors import ConfigError as SharedConfigError

if TYPE_CHECKING:
    from mesh.core.admission._admission import Admission

__all__ = ["CreditDesk", "StrictGate", "STRICT_BOUND", "open_strict"]

NS_PER_MS = 1_000_000
STRICT_BOUND = BOUNDS["strict"]
_BEFORE_ALL = -(2**62)  # an instant earlier than any clock reading
_NO_BLOCK = HeldBlock(0, 0, 0, _BEFORE_ALL)  # the fast block when there is none: spends nothing


def _ignore(v: Gate) -> None:
    v.flush_at = NEVER


def open_strict(admission: Admission, policy: TenantRatePolicy) -> Gate:
    """`strict`: the mesh's view in front (with a reporter) and this worker's credit; with
    no credit source attached (no `strict:` section), shut, saying governor_unreachable."""
    credit = admission.credit
    if credit is None:
        return FixedGate(
            policy,
            _ignore,
            False,
            STRICT_BOUND,
            Suspension.GOVERNOR_UNREACHABLE,
            Reason.GOVERNOR_UNREACHABLE,
        )
    reporter = admission.reporter
    front = None if reporter is None else reporter.open_gate(policy)
    return credit.open(policy, front)


class StrictGate(Gate):
    """One strict (tenant, metric): its mesh view (`front`, None without a mesh) and the
    credit it holds. `avail` stays 0, so `Admission.try_admit` always lands here.

    The hot path spends from the holder's fast block by itself (`CreditHolder.fast_block`:
    the block a full `try_spend` would take from, and the instant `until` to which it would)
    by lowering its ``left``, and tells the holder what it spent once per millisecond (its
    demand, `spent`): `mark` is ``left`` when it last told, so ``mark - left`` is what it
    has spent since. `admit` is the whole step; `Admission.try_admit` inlines its common
    case (the same block, the same millisecond). The rule both inline, "spend while
    ``now < until`` and the units are left in that block", is pinned to `try_spend` by a
    hypothesis test (tests/mesh/core/test_strict_gate.py). Safety does not rest on the
    cache being fresh: `until` is never past the block's local expiry, ``left`` is the
    holder's own count, and a block the holder returns has ``left`` 0."""

    __slots__ = (
        "front",
        "loop",
        "holder",
        "desk",
        "clock_ns",
        "key",
        "no_credit",
        "no_unreachable",
        "block",
        "until_ns",
        "mark",
        "batch_ms",
        "batch_end_ns",
        "admitted",
        "amount_max",
        "largest",
    )

    def __init__(
        self, policy: TenantRatePolicy, front: GlobalGate | None, desk: CreditDesk
    ) -> None:
        super().__init__(policy, _ignore)
        self.flush_at = NEVER
        self.front = front
        self.desk = desk
        self.clock_ns = desk.clock_ns
        self.key: RateKey = policy.rate_key
        self.loop = CreditLoop(desk.config)  # when to ask governord, and the back-off
        self.holder = self.loop.holder
        self.set_verdicts(STRICT_BOUND, None, Reason.NO_CREDIT)
        self.no_credit = self.no
        self.no_unreachable = verdict(
            False,
            Reason.GOVERNOR_UNREACHABLE,
            Mode.STRICT,
            STRICT_BOUND,
            Suspension.GOVERNOR_UNREACHABLE,
            limit=policy.limit_per_s,
            step=Step.STRICT,
        )
        # The fast block, the instant (ns, exclusive) until which it is spent from here, its
        # `left` when the holder was last told; the millisecond of the spends since, and its
        # end (ns, exclusive).
        self.block = _NO_BLOCK
        self.until_ns = _BEFORE_ALL
        self.mark = 0
        self.batch_ms = _BEFORE_ALL
        self.batch_end_ns = _BEFORE_ALL
        self.admitted = 0  # sub-units admitted here and told (`admitted_now` adds the rest)
        # Larger asks are TOO_LARGE (Admission._deny). With scale > 1 (a rate not whole per
        # second) 0, so every ask takes `admit`, which spends `scale` sub-units of credit a
        # unit: the inline fast path stays the scale-1 path it was.
        self.largest = policy.burst_units
        if front is not None and front.largest < self.largest:
            self.largest = front.largest  # the mesh's view vetoes more than b, always
        self.amount_max = self.largest if policy.scale == 1 else 0

    def bounded_by(self, burst: int) -> None:
        """governord stated its bucket's burst (sub-units): no amount above it can ever be
        granted, so a larger one is `too_large` (`Admission._deny`), not `no_credit`."""
        units = burst // self.scale
        if 0 < units < self.largest:
            self.largest = units
            if self.amount_max:
                self.amount_max = units

    def admit(self, amount: int) -> Verdict:
        """The mesh's veto, then credit; the mesh is charged only if both admit."""
        if amount > self.largest:
            return self.too_large()
        front = self.front
        if front is not None and amount > front.avail:
            front.wanted(amount)  # the owner hears of the demand, as for a global limit
            self.desk.vetoed += amount
            no = front.no
            reason = Reason.GLOBAL_LIMIT if no.reason is Reason.RATE_LIMITED else no.reason
            return verdict(
                False,
                reason,
                Mode.STRICT,
                STRICT_BOUND,
                no.suspended,
                limit=no.limit,
                step=Step.MESH,
            )
        now_ns = self.clock_ns()
        block = self.block
        need = amount * self.scale  # credit is in sub-units, as governord meters the policy
        # `now_ms < until_ms` is `now_ns < until_ms * NS_PER_MS` (integers): no division
        if now_ns < self.until_ns and need <= block.left:
            if now_ns >= self.batch_end_ns:  # a new millisecond: tell the last one's spends
                self.flush()
                now_ms = now_ns // NS_PER_MS
                self.batch_ms, self.batch_end_ns = now_ms, (now_ms + 1) * NS_PER_MS
            block.left -= need
        elif not self._spend(now_ns // NS_PER_MS, need):
            return self.no
        if front is not None:
            front.avail -= amount
            front.pending += amount
            if front.pending >= front.flush_at:
                front.sink(front)
        return self.ok

    def numbers(self, amount: int, allowed: bool, now_ns: int) -> Numbers:
        """`remaining`: the credit held that may be spent now (`CreditHolder.held`, at the
        desk's clock), at most what the mesh's view passes. `retry_after_ms`, denied: the
        view's own when it vetoes; else until this gate asks governord again (a refill is
        in flight or asked at once: 1 ms). `reset_after_ms` None: governord holds the
        bucket, and a worker sees only the blocks it was granted."""
        self.flush()  # the holder hears of the fast path's spends before its time moves
        now_ms = self.desk.now_ms()
        remaining = self.holder.held(now_ms) // self.scale
        front = self.front
        retry: int | None = 0
        if front is not None:
            if remaining > front.avail:
                remaining = max(front.avail, 0)
            if not allowed and amount > front.avail:
                return Numbers(remaining, front.numbers(amount, False, now_ns).retry_after_ms, None)
        if not allowed:
            retry = max(1, self.loop.retry_at_ms - now_ms)
        return Numbers(remaining, retry, None)

    def flush(self) -> None:
        """Tell the holder the spends made here (before anything that reads its demand or
        changes its blocks), at the millisecond they were made in."""
        left = self.block.left
        spent = self.mark - left
        if spent:
            self.holder.spent(self.batch_ms, spent)
            self.admitted += spent
            self.mark = left

    def admitted_now(self) -> int:
        """Units admitted here, told to the holder or not yet (`admitted` and the blocks
        count sub-units: `scale` a unit)."""
        return (self.admitted + self.mark - self.block.left) // self.scale

    def forget_fast(self) -> None:
        """The holder's blocks changed (a grant): the next spend goes through it."""
        self.until_ns = _BEFORE_ALL

    def _spend(self, now_ms: int, amount: int) -> bool:
        """A full spend through the holder; on a denial, the verdict set and a reserve asked."""
        self.flush()
        holder = self.holder
        spend = holder.try_spend(now_ms, amount)
        if spend.admitted:
            self.admitted += amount
            block, until_ms = holder.fast_block()
            if block is None:
                self.block, self.until_ns = _NO_BLOCK, _BEFORE_ALL
            else:
                self.block, self.until_ns = block, until_ms * NS_PER_MS
            self.mark = self.block.left
            self.batch_ms, self.batch_end_ns = now_ms, (now_ms + 1) * NS_PER_MS
            return True
        self.until_ns = _BEFORE_ALL
        self.no = self.no_unreachable if spend.reason == GOVERNOR_UNREACHABLE else self.no_credit
        desk = self.desk
        desk.credit_denied += amount // self.scale  # `amount` is in sub-units here: units
        desk.ask(self, now_ms, amount)
        return False

    def holds_nothing(self) -> bool:
        """No block held and none asked for: forgetting the gate strands no credit."""
        return not self.holder.blocks and self.holder.in_flight is None

    # ---- what admission asks of the view (`Gate`) -----------------------------------------

    def deny(self, amount: int, admission: Admission) -> Verdict:
        """`avail` stays 0: every admission the hot path does not inline lands here."""
        return self.admit(amount)

    def refund(self, amount: int) -> None:
        """The mesh's charge goes back; spent credit does not (a unit taken from a block
        stays spent, which only ever lowers what is admitted)."""
        if self.front is not None:
            self.front.refund(amount)

    def idle(self, admission: Admission) -> bool:
        """No credit held or asked for, and the mesh's view in front idle too."""
        if not self.holds_nothing():
            return False
        reporter = admission.reporter
        return self.front is None or (
            reporter is not None and reporter.forget_if_idle(self.front.key)
        )

    def forget(self, admission: Admission, *, retire: bool) -> None:
        """Give back what the gate holds; a new generation retires the front's key."""
        if retire and self.front is not None and admission.reporter is not None:
            admission.reporter.retire(self.front.key)
        self.desk.close(self)

    def health(self) -> dict[str, object]:
        """The credit held: units spendable now, from live blocks."""
        return {"credit_held": self.holder.held(self.desk.now_ms()) // self.scale}

    def deadline(self) -> Verdict | None:
        """A waiter's deadline while credit fails closed carries the suspension."""
        no = self.no
        if no.suspended is None:
            return None
        return verdict(
            False,
            Reason.DEADLINE_EXCEEDED,
            Mode.STRICT,
            no.bound,
            no.suspended,
            limit=no.limit,
            step=Step.QUEUE,
        )


class CreditDesk:
    """The strict gates of one worker, the clock they spend by, and their calls to make.

    The outbox holds at most one reserve per gate (a holder asks one at a time) and a
    return per block granted; the driver empties it at every tick.
    """

    def __init__(self, clock_ns: Callable[[], int], config: CreditConfig | None = None) -> None:
        if not callable(clock_ns):
            raise SharedConfigError("clock_ns", "must be a callable returning nanoseconds")
        self.clock_ns = clock_ns
        self.config = config or CreditConfig()
        self.gates: dict[RateKey, StrictGate] = {}
        self.wake: Callable[[], None] = _noop  # the driver's "send soon" (a reserve queued)
        self.closing = False
        self._out: list[Effect] = []
        self.admitted_closed = 0  # units admitted by credit, by gates closed since
        self.vetoed = 0  # units the mesh turned away first
        self.credit_denied = 0  # units the mesh passed and credit denied (nothing charged)
        self.reserves = 0  # reserves asked for
        self.returns = 0  # blocks given back

    def now_ms(self) -> int:
        return self.clock_ns() // NS_PER_MS

    @property
    def admitted(self) -> int:
        """Units admitted by credit (each gate counts its own: the hot path's)."""
        return self.admitted_closed + sum(g.admitted_now() for g in self.gates.values())

    # -- gates ----------------------------------------------------------------------------

    def open(self, policy: TenantRatePolicy, front: GlobalGate | None) -> StrictGate:
        gate = StrictGate(policy, front, self)
        old = self.gates.get(gate.key)
        if old is not None:
            self.close(old)
        self.gates[gate.key] = gate
        return gate

    def close(self, gate: StrictGate) -> None:
        """The gate is forgotten or replaced: give back what it holds. A reserve still in
        flight for it is returned whole when it is granted (`granted`)."""
        if self.gates.get(gate.key) is gate:
            del self.gates[gate.key]
            self.admitted_closed += gate.admitted_now()
        self._give_back(gate, self.now_ms(), leaving=True)

    # -- asking ---------------------------------------------------------------------------

    def ask(self, gate: StrictGate, now_ms: int, amount: int) -> None:
        """Credit denied `amount`: a refill, unless one is in flight or governord said no
        a moment ago. Sized for at least `amount`, so a large admission is not starved."""
        if self.closing:
            return
        request = gate.loop.short(now_ms, amount)
        if request is not None:
            self._reserve(gate, request)
            self.wake()

    def _reserve(self, gate: StrictGate, request: Reserve) -> None:
        self.reserves += 1
        self._out.append(ReserveCredit(gate.key, request))

    def tick(self, now_ns: int) -> None:
        """Refill ahead of need and give back what is spent out or idle.

        `now_ns` was read before the caller took the node's lock, so an admit on another
        thread may since have shown the holders a later instant; time never goes back for
        them (a holder refuses that), so the later of the two is used. Later is the safe
        side: blocks only expire sooner."""
        now_ms = max(now_ns // NS_PER_MS, self.now_ms())
        for gate in list(self.gates.values()):
            self._give_back(gate, now_ms)
            if not self.closing:
                request = gate.loop.ahead(now_ms)
                if request is not None:
                    self._reserve(gate, request)

    def _give_back(self, gate: StrictGate, now_ms: int, *, leaving: bool = False) -> None:
        gate.flush()
        for block_id, unused in gate.loop.returns(now_ms, leaving=leaving):
            self.returns += 1
            self._out.append(ReturnCredit(gate.key, block_id, unused))
        gate.mark = gate.block.left  # a block returned has `left` 0: nothing was spent

    def take(self) -> list[Effect]:
        """The calls to make now (the driver's part)."""
        out, self._out = self._out, []
        return out

    def leave(self) -> list[Effect]:
        """The worker is leaving: ask for nothing more and give back everything held."""
        self.closing = True
        now_ms = self.now_ms()
        for gate in list(self.gates.values()):
            self._give_back(gate, now_ms, leaving=True)
        return self.take()

    # -- answers --------------------------------------------------------------------------

    def granted(self, request: ReserveCredit, block_id: int, units: int, ttl_ms: int) -> None:
        """governord granted a block. For a gate that is gone, or a reply that does not
        fit, the block goes back whole: nothing was spent from it."""
        gate = self.gates.get(request.rate_key)
        if gate is None or gate.holder.in_flight is not request.request or self.closing:
            if gate is not None and gate.holder.in_flight is request.request:
                gate.loop.abandon(request.request)
            self._out.append(ReturnCredit(request.rate_key, block_id, units))
            return
        now_ms = self.now_ms()
        held = gate.loop.granted(
            now_ms, request.request, block_id, units, ttl_ms, instant=self.clock_ns()
        )
        if held is None:
            return  # a grant that does not fit: nothing held (the block expires unspent)
        gate.forget_fast()  # the new block may expire first: the next spend asks the holder
        gate.no = gate.no_credit

    def reachable(self) -> None:
        """governord is back after it could not be reached: gates waiting out an unreachable
        reserve ask again at once, those with recent demand right now."""
        now_ms = self.now_ms()
        for gate in self.gates.values():
            gate.loop.reachable(now_ms)
            if not self.closing and gate.holder.unreachable:
                request = gate.loop.ahead(now_ms, ahead=False)
                if request is not None:
                    self._reserve(gate, request)

    def learned_burst(self, rate_key: RateKey, burst: int, per_s: int | None = None) -> None:
        """governord stated the burst B (and rate R, ``per_s``) of the rate a strict key
        spends at (the driver read its node): the gate's blocks stay within a share of B
        (`CreditHolder.block_size`), a drained wait follows B / R (`ratemesh.creditsize`)."""
        gate = self.gates.get(rate_key)
        if gate is not None:
            gate.holder.learn_burst(burst, per_s)
            gate.bounded_by(burst)

    def failed(
        self, request: ReserveCredit, *, unreachable: bool, burst: int | None = None
    ) -> None:
        """The reserve was denied (`unreachable=False`) or never reached governord.

        `burst`: the denial was an empty bucket's, stating its B (`ratemesh.credit.
        rate_burst`): no amount above it is ever granted (`bounded_by`). When the gate asks
        again is its loop's (`ratemesh.creditloop`)."""
        gate = self.gates.get(request.rate_key)
        if gate is None or gate.holder.in_flight is not request.request:
            return
        now_ms = self.now_ms()
        if unreachable:
            gate.loop.unreachable(now_ms, request.request)
            gate.no = gate.no_unreachable
            return
        gate.loop.denied(now_ms, request.request, burst, instant=self.clock_ns())
        if burst is not None:
            gate.bounded_by(burst)


def _noop() -> None:
    pass

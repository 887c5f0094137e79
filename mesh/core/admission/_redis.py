"""Redis mode (seed 002): one atomic GCRA step per admission against a shared counter,
exact while it answers, and an embedded local limiter when it does not.

The round trip is I/O, so the core never makes it while the node's lock is held. For a
redis view `Admission.try_admit` answers the sentinel `REDIS_ASK` (and notes the view in
`Admission.asked`); the driver then, under its lock, asks the desk to `begin` (the breaker
says whether the call may go out), makes the round trip with no lock held
(`Counter.step`), and under the lock again hands the reply to `finish`, which records the
outcome on the breaker and returns the verdict: Redis's, or the embedded limiter's when
Redis did not answer (breaker open, deadline exceeded, refused, a fatal reply, a malformed
one). `RedisDesk.decide` is the three steps in a row, for a caller with no lock (tests,
the simulator): whoever drives an `Admission` that has a desk must answer REDIS_ASK so,
as `mesh.node.Mesh` does for every form (`mesh.aio.admit`'s queues do not).

Every fallback verdict carries the suspension `redis_unreachable` and the bound
`redis_unreachable:fleet<=N*limit`: each process then enforces the whole limit alone. The
finer cause is counted per desk (`fallbacks`, by `Cause`) for /health and /metrics. The
embedded limiter is a GCRA of the full limit that also hears what Redis admitted here, so
an outage starts from this process's recent use rather than a full bucket.

Keys: `KEY_PREFIX` + blake2b of the RateKey (tenant, metric, generation), so tenant ids
never appear in the shared keyspace, and a new generation starts a new bucket.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from mesh.core.admission._breaker import Breaker
from mesh.core.admission._counter import NUMBER_MAX, Counter, CounterOutcome, CounterReply
from mesh.core.admission._gates import LocalGate
from mesh.core.gate import NEVER, Gate
from mesh.core.gcra import Gcra
from mesh.core.policy import BOUNDS, Mode, RateKey, TenantRatePolicy
from mesh.core.verdict import Numbers, Reason, Step, Suspension, Verdict, ms_ceil, verdict

if TYPE_CHECKING:
    from mesh.core.admission._admission import Admission

__all__ = [
    "Ask",
    "Cause",
    "KEY_PREFIX",
    "REDIS_ASK",
    "REDIS_BOUND",
    "REDIS_DEADLINE_MS",
    "RedisDesk",
    "RedisGate",
    "open_redis",
    "redis_key",
]

KEY_PREFIX = "rm:gcra:"
KEY_DIGEST_BYTES = 16  # 128 bits of blake2b: collisions are not a concern at any fleet size
REDIS_DEADLINE_MS = 5  # one round trip (seed 002; not config): slower falls back
REDIS_BOUND = BOUNDS["redis"]
FALLBACK_BOUND = BOUNDS["redis_unreachable"]
# What `Admission.try_admit` answers for a redis view: not a decision, a request to the
# driver to make the round trip (module docstring). Never interned, never counted, never
# returned to a caller of the Mesh.
REDIS_ASK = Verdict(False, Reason.RATE_LIMITED, Mode.REDIS, "redis:ask", step=Step.REDIS)


class Cause(StrEnum):
    """Why the embedded limiter answered instead of Redis (seed 002's four, plus a refused
    connection, and a policy whose numbers the script cannot meter exactly)."""

    DEADLINE_EXCEEDED = "deadline_exceeded"
    BREAKER_OPEN = "breaker_open"
    EVAL_ERROR = "eval_error"
    REPLY_MALFORMED = "reply_malformed"
    CONNECT_FAILED = "connect_failed"
    OUT_OF_RANGE = "out_of_range"  # rate or burst above NUMBER_MAX: never sent


_CAUSE = {
    CounterOutcome.DEADLINE_EXCEEDED: Cause.DEADLINE_EXCEEDED,
    CounterOutcome.CONNECT_FAILED: Cause.CONNECT_FAILED,
    CounterOutcome.EVAL_ERROR: Cause.EVAL_ERROR,
    CounterOutcome.REPLY_MALFORMED: Cause.REPLY_MALFORMED,
}


def redis_key(key: RateKey) -> str:
    """The shared counter's key for a RateKey: a fixed prefix and a hash of the scope."""
    digest = hashlib.blake2b(key.ring_token().encode(), digest_size=KEY_DIGEST_BYTES)
    return KEY_PREFIX + digest.hexdigest()


class Ask(NamedTuple):
    """One round trip to make: `Counter.step(key, rate, burst, amount)`, in sub-units."""

    key: str
    rate: int
    burst: int
    amount: int
    probe: bool  # the breaker's half-open probe


def _ignore(v: Gate) -> None:
    v.flush_at = NEVER


def open_redis(admission: Admission, policy: TenantRatePolicy) -> Gate:
    """`redis`: a view of the shared counter, or with no shared_state.redis (nothing dials)
    this process enforcing the whole limit alone (local mode's view), every verdict
    saying so."""
    if admission.redis is not None:
        return admission.redis.open(policy, admission._now_ns)
    alone = LocalGate(policy, admission._mark_local, admission._now_ns, 1)
    alone.set_verdicts(FALLBACK_BOUND, Suspension.REDIS_UNREACHABLE, step=Step.LOCAL)
    return alone


class RedisGate(Gate):
    """One redis-mode (tenant, metric). `avail` stays 0, so `Admission.try_admit` always
    reaches `deny`, which answers REDIS_ASK. `ok`/`no` are Redis's verdicts (step redis,
    the exact bound); `fallback_ok`/`fallback_no` the embedded limiter's. A refund gives
    nothing back: the script is acquire-only, what Redis admitted stays spent."""

    __slots__ = ("redis_key", "fallback", "fallback_ok", "fallback_no", "exact", "desk")

    def __init__(self, policy: TenantRatePolicy, desk: RedisDesk, now_ns: int) -> None:
        super().__init__(policy, _ignore)
        self.flush_at = NEVER
        self.desk = desk
        self.redis_key = redis_key(policy.rate_key)
        self.fallback = Gcra(policy.target_rate, policy.global_burst, now_ns)
        self.exact = policy.target_rate <= NUMBER_MAX and policy.global_burst <= NUMBER_MAX
        limit = policy.limit_per_s
        self.fallback_ok = _fallback(True, limit)
        self.fallback_no = _fallback(False, limit)

    def numbers(self, amount: int, allowed: bool, now_ns: int) -> Numbers:
        """Asked only for a verdict the core gave without a round trip (`too_large`): the
        embedded limiter's view, which is all this process knows."""
        return self.desk.fallback_numbers(self, amount, allowed, now_ns)

    def deny(self, amount: int, admission: Admission) -> Verdict:
        """Not a decision: the driver makes the round trip (module docstring)."""
        admission.asked = self
        return REDIS_ASK

    def idle(self, admission: Admission) -> bool:
        """The state is in Redis; the embedded limiter holds nothing once full again."""
        return self.fallback.ahead_ns(admission._now_ns) == 0


def _fallback(allowed: bool, limit: int) -> Verdict:
    return verdict(
        allowed,
        Reason.ADMITTED if allowed else Reason.RATE_LIMITED,
        Mode.REDIS,
        FALLBACK_BOUND,
        Suspension.REDIS_UNREACHABLE,
        limit=limit,
        step=Step.LOCAL,
    )


class RedisDesk:
    """The redis views of one worker: their breaker (one per Redis tier), the clock they
    decide by, and the counts /health and /metrics show."""

    def __init__(self, clock_ns: Callable[[], int]) -> None:
        if not callable(clock_ns):
            raise TypeError("clock_ns must be a callable returning nanoseconds")
        self.clock_ns = clock_ns
        self.breaker = Breaker()
        self.asked = 0  # round trips begun
        self.answered = 0  # decisions Redis made
        self.fallbacks: dict[Cause, int] = dict.fromkeys(Cause, 0)
        self.last_error = ""  # the last failure's text (no tenant ids: keys are hashed)
        self.last_error_ns: int | None = None

    def open(self, policy: TenantRatePolicy, now_ns: int) -> RedisGate:
        return RedisGate(policy, self, now_ns)

    def begin(self, gate: RedisGate, amount: int) -> Ask | None:
        """The round trip to make for `amount` units, or None: the breaker is open (or the
        policy's numbers are out of the script's exact range) and `finish` answers from
        the embedded limiter with no I/O."""
        if not gate.exact:
            return None
        allowed, probe = self.breaker.call(self.clock_ns())
        if not allowed:
            return None
        self.asked += 1
        p = gate.policy
        return Ask(gate.redis_key, p.target_rate, p.global_burst, amount * gate.scale, probe)

    def finish(
        self, gate: RedisGate, amount: int, ask: Ask | None, reply: CounterReply | None
    ) -> tuple[Verdict, Numbers]:
        """The verdict for `amount` now that the round trip `ask` answered `reply` (both
        None: none was made), with its numbers: Redis's when it answered."""
        now_ns = self.clock_ns()
        if ask is None or reply is None:
            cause = Cause.BREAKER_OPEN if gate.exact else Cause.OUT_OF_RANGE
        elif reply.outcome is CounterOutcome.OK:
            self.breaker.record(True, ask.probe, now_ns)
            self.answered += 1
            scale = gate.scale
            if reply.allowed:
                gate.fallback.apply(now_ns, ask.amount)  # the embedded limiter hears it
                return gate.ok, Numbers(reply.remaining // scale, 0, reply.reset_after_ms)
            retry = max(reply.retry_after_ms, 1)
            return gate.no, Numbers(reply.remaining // scale, retry, reply.reset_after_ms)
        else:
            self.breaker.record(False, ask.probe, now_ns)
            cause = _CAUSE.get(reply.outcome, Cause.REPLY_MALFORMED)
            self.last_error = reply.error or cause.value
            self.last_error_ns = now_ns
        self.fallbacks[cause] += 1
        allowed = gate.fallback.try_take(now_ns, amount * gate.scale)
        v = gate.fallback_ok if allowed else gate.fallback_no
        return v, self.fallback_numbers(gate, amount, allowed, now_ns)

    def fallback_numbers(self, gate: RedisGate, amount: int, allowed: bool, now_ns: int) -> Numbers:
        """The embedded limiter's numbers (`LocalGate.numbers`'s arithmetic on its meter)."""
        m, need = gate.fallback, amount * gate.scale
        wait, ahead = m.forecast(now_ns, 0, now_ns, min(need, m.burst))
        retry: int | None = 0
        if not allowed:
            retry = None if need > m.burst else max(1, ms_ceil(wait))
        return Numbers(m.remaining(now_ns) // gate.scale, retry, ms_ceil(ahead))

    def decide(self, gate: RedisGate, amount: int, counter: Counter) -> tuple[Verdict, Numbers]:
        """begin, the round trip, finish: for a caller that holds no lock to drop."""
        ask = self.begin(gate, amount)
        reply = None if ask is None else counter.step(ask.key, ask.rate, ask.burst, ask.amount)
        return self.finish(gate, amount, ask, reply)

    def health(self) -> dict[str, Any]:
        """What the tier knows (the node's /health): breaker, counts, the last error."""
        b = self.breaker
        return {
            "breaker": b.state.value,
            "breaker_opened": b.opened,
            "breaker_closed": b.closed,
            "asked": self.asked,
            "answered": self.answered,
            "fallbacks": {c.value: n for c, n in self.fallbacks.items()},
            "last_error": self.last_error or None,
            "last_error_age_ms": None
            if self.last_error_ns is None
            else (self.clock_ns() - self.last_error_ns) // 1_000_000,
        }

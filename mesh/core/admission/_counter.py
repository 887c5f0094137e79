"""The shared counter behind redis mode, as the core sees it: a Protocol, its reply, the
GCRA step the counter runs, and an in-memory counter (core tests, the simulator).

One round trip is `Counter.step(key, rate, burst, amount)`: GCRA on the counter's own
clock (Redis: the server's `TIME`, so replicas need not agree on a clock), redis-cell
semantics (the key holds the theoretical arrival time and expires when the bucket is full
again). The driver (mesh.sharedstate) runs `gcra_step` as a Lua script; `MemoryCounter`
runs it here; a test pins the script to this function on random inputs.

Arithmetic: time in integer microseconds (what `TIME` gives), the TAT kept exactly as
`tat_us + rem / rate` with 0 <= rem < rate, so every value the script holds is an integer
below 2**53 (exact in Lua's doubles) while rate and burst are at most NUMBER_MAX.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

__all__ = [
    "Counter",
    "CounterOutcome",
    "CounterReply",
    "GcraState",
    "MemoryCounter",
    "MEMORY_KEYS_MAX",
    "NUMBER_MAX",
    "US_PER_S",
    "gcra_step",
    "parse_reply",
]

US_PER_S = 1_000_000
# The largest rate (sub-units/s) and burst (sub-units) the script meters exactly: its values
# stay below 2 * NUMBER_MAX * US_PER_S + 2 * NUMBER_MAX < 2**53.
NUMBER_MAX = (1 << 50) // US_PER_S
MEMORY_KEYS_MAX = 1 << 20  # keys a MemoryCounter holds; past it, full buckets are dropped


class CounterOutcome(StrEnum):
    """How one round trip ended. Every outcome but OK is a failure to the breaker."""

    OK = "ok"
    DEADLINE_EXCEEDED = "deadline_exceeded"  # no answer within the 5 ms deadline
    CONNECT_FAILED = "connect_failed"  # refused, reset, closed, or authentication failed
    EVAL_ERROR = "eval_error"  # a fatal server reply on a live socket (script error, OOM...)
    REPLY_MALFORMED = "reply_malformed"  # an answer that is not the script's four integers


class CounterReply(NamedTuple):
    """One round trip's outcome and, when OK, the script's answer: `remaining` in the
    policy's sub-units, the waits in whole milliseconds (rounded up). `error`: what went
    wrong, for the node's health (never a tenant id: keys are hashed)."""

    outcome: CounterOutcome
    allowed: bool = False
    remaining: int = 0
    retry_after_ms: int = 0
    reset_after_ms: int = 0
    error: str = ""


class Counter(Protocol):
    """The round trip redis mode makes per admission (mesh.sharedstate's RedisCounter,
    `MemoryCounter` below). It never raises: every failure is an outcome."""

    def step(self, key: str, rate: int, burst: int, amount: int) -> CounterReply: ...


class GcraState(NamedTuple):
    """What a key holds: the TAT as whole microseconds plus rem / rate of one."""

    tat_us: int
    rem: int


def _ms_ceil(us: int) -> int:
    return -(-us // 1000) if us > 0 else 0


def gcra_step(
    state: GcraState | None, now_us: int, rate: int, burst: int, amount: int
) -> tuple[GcraState | None, CounterReply]:
    """One GCRA step at `now_us` for `amount` (rate per second, burst and amount in the
    same sub-units): the state to keep (None: leave it as it was) and the answer. The
    answer's `reset_after_ms` is also the key's expiry (PEXPIRE): a key that expired is
    a full bucket, the state `None` stands for."""
    tat_us, rem = state if state is not None else (now_us, 0)
    if tat_us < now_us:  # tat_us + rem/rate < now: the bucket is full
        tat_us, rem = now_us, 0
    tau = burst * US_PER_S  # in scaled ticks: one unit is US_PER_S of them
    total = rem + amount * US_PER_S
    new_us, new_rem = tat_us + total // rate, total % rate
    ahead = (new_us - now_us) * rate + new_rem
    if ahead <= tau:
        left = (tau - ahead) // US_PER_S
        reset = _ms_ceil(-(-ahead // rate))
        return GcraState(new_us, new_rem), CounterReply(CounterOutcome.OK, True, left, 0, reset)
    was = (tat_us - now_us) * rate + rem
    left = max(tau - was, 0) // US_PER_S
    retry = _ms_ceil(-(-(ahead - tau) // rate))
    reset = _ms_ceil(-(-was // rate))
    return None, CounterReply(CounterOutcome.OK, False, left, max(retry, 1), reset)


def parse_reply(raw: Any, burst: int) -> CounterReply:
    """The script's answer `[allowed, remaining, retry_after_ms, reset_after_ms]` checked
    as untrusted input: four integers, allowed 0 or 1, remaining within the burst, waits
    non-negative. Anything else is REPLY_MALFORMED (the breaker counts it a failure)."""
    if not isinstance(raw, (list, tuple)) or len(raw) != 4:
        return _malformed(f"expected 4 integers, got {type(raw).__name__}")
    if any(type(x) is not int for x in raw):
        return _malformed("expected 4 integers")
    allowed, remaining, retry, reset = raw
    if allowed not in (0, 1) or not 0 <= remaining <= burst or retry < 0 or reset < 0:
        return _malformed(f"out of range: {list(raw)!r}")
    return CounterReply(CounterOutcome.OK, allowed == 1, remaining, retry, reset)


def _malformed(why: str) -> CounterReply:
    return CounterReply(CounterOutcome.REPLY_MALFORMED, error=f"reply malformed: {why}")


class MemoryCounter:
    """`Counter` in this process, on a clock it is given (ns): what the Redis script does,
    with no I/O. `fail` makes every step answer that outcome instead (a frozen, dead or
    broken Redis, for core tests and the simulator); `steps` counts round trips."""

    def __init__(self, clock_ns: Callable[[], int]) -> None:
        self.clock_ns = clock_ns
        self.keys: dict[str, GcraState] = {}
        self.fail: CounterOutcome | None = None
        self.steps = 0

    def step(self, key: str, rate: int, burst: int, amount: int) -> CounterReply:
        self.steps += 1
        if self.fail is not None and self.fail is not CounterOutcome.OK:
            return CounterReply(self.fail, error=f"memory counter: {self.fail.value}")
        now_us = self.clock_ns() // 1000
        state, reply = gcra_step(self.keys.get(key), now_us, rate, burst, amount)
        if state is not None:
            if key not in self.keys and len(self.keys) >= MEMORY_KEYS_MAX:
                self._drop_full(now_us)
            self.keys[key] = state
        return reply

    def _drop_full(self, now_us: int) -> None:
        """Forget keys whose bucket is full again (their expiry passed, as Redis would)."""
        for k in [k for k, s in self.keys.items() if s.tat_us < now_us]:
            del self.keys[k]

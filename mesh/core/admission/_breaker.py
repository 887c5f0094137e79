"""The redis tier's circuit breaker: closed, open, half-open, as a transition table.

Seed 002: five consecutive failures open it (a fatal server reply on a live socket counts as
a failure, so "reachable" does not pass for healthy); while it is open every call fails
fast, answered by the embedded limiter with no round trip; once the probe interval has
passed since it opened, the next call is the one half-open probe, and a good answer closes
it again. Recovery is positive: only a good answer closes it, never a timer alone.

The driver classifies each fact into a `BreakerInput` (a call early or due, a success, a
failure, the failure that trips it, the probe's failure) and `TRANSITIONS` says, as data,
the next state and whether a call may go to Redis. Tests enumerate every pair. A probe that
never reports (its thread died) does not wedge the breaker half-open: a call one probe
interval after the probe began is a new probe.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

__all__ = [
    "BREAKER_FAILURES",
    "BREAKER_PROBE_NS",
    "Breaker",
    "BreakerInput",
    "BreakerState",
    "Transition",
    "TRANSITIONS",
]

BREAKER_FAILURES = 5  # consecutive failures that open the breaker (seed 002; not config)
BREAKER_PROBE_NS = 5_000_000_000  # open this long before one half-open probe (seed 002)


class BreakerState(StrEnum):
    CLOSED = "closed"  # calls go to Redis
    OPEN = "open"  # calls fail fast; the embedded limiter answers
    HALF_OPEN = "half_open"  # one probe is out; the others fail fast until it reports


class BreakerInput(StrEnum):
    CALL_EARLY = "call_early"  # a call before the probe is due (or with none to wait for)
    CALL_DUE = "call_due"  # a call once the probe interval has passed
    SUCCESS = "success"  # a good answer (any call's: Redis is back)
    FAILURE = "failure"  # a failure short of the threshold, or a straggler's
    FAILURE_TRIPS = "failure_trips"  # the failure that reaches BREAKER_FAILURES in a row
    PROBE_FAILED = "probe_failed"  # the half-open probe's failure


class Transition(NamedTuple):
    state: BreakerState
    allow: bool | None  # for a call: whether it goes to Redis; None for an outcome


_C, _O, _H = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
_I = BreakerInput
TRANSITIONS: dict[tuple[BreakerState, BreakerInput], Transition] = {
    (_C, _I.CALL_EARLY): Transition(_C, True),
    (_C, _I.CALL_DUE): Transition(_C, True),
    (_C, _I.SUCCESS): Transition(_C, None),
    (_C, _I.FAILURE): Transition(_C, None),
    (_C, _I.FAILURE_TRIPS): Transition(_O, None),
    (_C, _I.PROBE_FAILED): Transition(_O, None),  # not reached: no probe while closed
    (_O, _I.CALL_EARLY): Transition(_O, False),
    (_O, _I.CALL_DUE): Transition(_H, True),  # this call is the probe
    (_O, _I.SUCCESS): Transition(_C, None),  # a straggler's good answer: Redis is back
    (_O, _I.FAILURE): Transition(_O, None),
    (_O, _I.FAILURE_TRIPS): Transition(_O, None),
    (_O, _I.PROBE_FAILED): Transition(_O, None),
    (_H, _I.CALL_EARLY): Transition(_H, False),  # the probe is out: fail fast
    (_H, _I.CALL_DUE): Transition(_H, True),  # the probe never reported: a new one
    (_H, _I.SUCCESS): Transition(_C, None),
    (_H, _I.FAILURE): Transition(_H, None),  # a straggler's: the probe decides
    (_H, _I.FAILURE_TRIPS): Transition(_H, None),
    (_H, _I.PROBE_FAILED): Transition(_O, None),
}


class Breaker:
    """One breaker per Redis tier (one address): the state, the failures in a row, and
    when the current open or probe began (ns on the desk's clock)."""

    __slots__ = ("state", "failures", "since_ns", "opened", "closed")

    def __init__(self) -> None:
        self.state = BreakerState.CLOSED
        self.failures = 0  # consecutive, while closed
        self.since_ns = 0  # when it opened, or when the probe went out
        self.opened = 0  # times it opened (health, /metrics)
        self.closed = 0  # times a good answer closed it after it opened

    def call(self, now_ns: int) -> tuple[bool, bool]:
        """A call wants to go to Redis: (allowed, is the probe)."""
        due = self.state is not BreakerState.CLOSED and now_ns - self.since_ns >= BREAKER_PROBE_NS
        t = self._step(BreakerInput.CALL_DUE if due else BreakerInput.CALL_EARLY, now_ns)
        return bool(t.allow), due and bool(t.allow)

    def record(self, ok: bool, probe: bool, now_ns: int) -> None:
        """A call's outcome: a good answer, or a failure (deadline, refused, a fatal reply,
        a malformed one)."""
        if ok:
            self._step(BreakerInput.SUCCESS, now_ns)
        elif probe and self.state is BreakerState.HALF_OPEN:
            self._step(BreakerInput.PROBE_FAILED, now_ns)
        elif self.state is BreakerState.CLOSED and self.failures + 1 >= BREAKER_FAILURES:
            self._step(BreakerInput.FAILURE_TRIPS, now_ns)
        else:
            self._step(BreakerInput.FAILURE, now_ns)

    def _step(self, what: BreakerInput, now_ns: int) -> Transition:
        before = self.state
        t = TRANSITIONS[(before, what)]
        self.state = t.state
        if what is BreakerInput.FAILURE and before is BreakerState.CLOSED:
            self.failures += 1
        if t.state is BreakerState.CLOSED:
            if before is not BreakerState.CLOSED:
                self.closed += 1
            if what is BreakerInput.SUCCESS:
                self.failures = 0
        elif before is BreakerState.CLOSED or what is BreakerInput.PROBE_FAILED:
            self.opened += before is BreakerState.CLOSED
            self.since_ns = now_ns  # opened (again): the probe is due one interval on
            self.failures = 0
        elif t.state is BreakerState.HALF_OPEN and what is BreakerInput.CALL_DUE:
            self.since_ns = now_ns  # the probe went out
        return t

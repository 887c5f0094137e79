"""Redis mode's round trips, made with the node's lock dropped (mesh/core/admission/_redis.py).

`Admission.try_admit` answers REDIS_ASK for a redis view; the Mesh then calls `begin` while
it still holds its lock, `end` after releasing it: the round trip runs with no lock held
(so threads never queue behind one another's Redis call), and the outcome is recorded on
the breaker and the embedded limiter under the lock again. The waiting forms (`admit`,
`admit_blocking`) of a redis limit do not queue on the node's loop: they ask again after
the answer's `retry_after_ms`, until the deadline, on the caller's thread or loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from mesh.core.admission import REDIS_ASK, Admission, Ask, Counter, RedisDesk, RedisGate
from mesh.core.policy import Mode
from mesh.core.verdict import STOPPED, Numbers, Reason, Step, Verdict, verdict
from mesh.errors import ConfigError

__all__ = ["Pending", "RedisRounds"]

Count = Callable[[str, str, Verdict], None]


class Pending(NamedTuple):
    desk: RedisDesk
    gate: RedisGate
    ask: Ask | None  # None: the breaker is open, the embedded limiter answered (`done`)
    done: tuple[Verdict, Numbers] | None = None


class RedisRounds:
    def __init__(
        self,
        counter: Counter | None,
        lock: AbstractContextManager[Any],
        count: Count | None,
    ) -> None:
        self.counter = counter
        self.lock = lock
        self.count = count

    def begin(self, adm: Admission, tenant: str, metric: str, amount: int) -> Pending:
        """Right after `try_admit` answered REDIS_ASK, under the same take of the lock. With
        no round trip to make (the breaker open) the embedded limiter answers here and now,
        so an outage costs no second take of the lock."""
        gate, desk = adm.asked, adm.redis
        assert gate is not None and desk is not None, "REDIS_ASK names a view of a desk"
        adm.asked = None
        ask = desk.begin(gate, amount) if self.counter is not None else None
        if ask is None:
            done = desk.finish(gate, amount, None, None)
            if self.count is not None:
                self.count(tenant, metric, done[0])
            return Pending(desk, gate, None, done)
        return Pending(desk, gate, ask)

    def end(self, p: Pending, tenant: str, metric: str, amount: int) -> tuple[Verdict, Numbers]:
        """The round trip (no lock held), then the verdict under the lock, counted."""
        if p.done is not None:  # answered (and counted) by `begin`
            return p.done
        ask = p.ask
        reply = None
        if ask is not None and self.counter is not None:
            reply = self.counter.step(ask.key, ask.rate, ask.burst, ask.amount)
        with self.lock:
            v, n = p.desk.finish(p.gate, amount, ask, reply)
            if self.count is not None:
                self.count(tenant, metric, v)
        return v, n

    def decide(
        self, adm: Admission, tenant: str, metric: str, amount: int
    ) -> tuple[Verdict, Numbers | None]:
        """One whole decision, as `Mesh.try_admit_numbers` makes it."""
        with self.lock:
            v = adm.try_admit(tenant, metric, amount)
            if v is not REDIS_ASK:
                if self.count is not None:
                    self.count(tenant, metric, v)
                return v, adm.numbers(v, tenant, metric, amount)
            pending = self.begin(adm, tenant, metric, amount)
        return self.end(pending, tenant, metric, amount)

    def applies(self, adm: Admission, tenant: str, metric: str) -> bool:
        """Whether (tenant, metric) is decided by a redis view (its waits take this path)."""
        if adm.redis is None:
            return False
        with self.lock:
            try:
                g = adm.gate(tenant, metric)
                if g is not None:
                    return isinstance(g, RedisGate)
                p = adm.policies.current(tenant, metric)
            except (ConfigError, TypeError):
                return False  # the ordinary path names the mistake
        return p is not None and p.enabled and p.mode is Mode.REDIS

    def wait_blocking(
        self,
        adm: Admission,
        tenant: str,
        metric: str,
        amount: int,
        timeout_s: float,
        closed: Callable[[], bool],
    ) -> Verdict:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            out, pause_s = self._round(adm, tenant, metric, amount, timeout_s, deadline, closed)
            if out is not None:
                return out
            time.sleep(pause_s)

    async def wait(
        self,
        adm: Admission,
        tenant: str,
        metric: str,
        amount: int,
        timeout_s: float,
        closed: Callable[[], bool],
    ) -> Verdict:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            out, pause_s = self._round(adm, tenant, metric, amount, timeout_s, deadline, closed)
            if out is not None:
                return out
            await asyncio.sleep(pause_s)

    def _round(
        self,
        adm: Admission,
        tenant: str,
        metric: str,
        amount: int,
        timeout_s: float,
        deadline: float,
        closed: Callable[[], bool],
    ) -> tuple[Verdict | None, float]:
        """One ask: the verdict to return, or None and how long to wait before the next."""
        if closed():
            return STOPPED, 0.0
        v, n = self.decide(adm, tenant, metric, amount)
        if n is None:
            return v, 0.0
        if v.allowed or n.retry_after_ms is None or timeout_s <= 0:
            return v.with_numbers(n), 0.0
        left = deadline - time.monotonic()
        if left <= 0:
            late = verdict(
                False,
                Reason.DEADLINE_EXCEEDED,
                v.mode,
                v.bound,
                v.suspended,
                limit=v.limit,
                step=Step.QUEUE,
            )
            return late.with_numbers(n), 0.0
        return None, min(n.retry_after_ms / 1000, left)

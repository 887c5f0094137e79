"""asyncio face of admission: `admit()` waits in the tenant's bounded queue.

The core decides; this module only parks a future and arms a timer for the deadline. The
owner of the event loop (the node, or `Ticker` below for a mesh-less process) must call
`Admission.tick` every sync interval so waiters are served as capacity returns.

A node in threaded mode passes its `lock` (app threads call `try_admit` concurrently) and a
`parked` set, so that stopping can fail every parked waiter at once instead of leaving it
to its deadline on a loop that is going away.

Its verdicts are detailed (`Admission.detail`): they carry the view's `remaining`,
`retry_after_ms` and `reset_after_ms` when they are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from mesh.core.admission._admission import QUEUE_FULL, Admission
from mesh.core.admission._queue import Waiter
from mesh.core.verdict import Verdict

__all__ = ["admit", "Ticker"]


async def admit(
    admission: Admission,
    tenant: str,
    metric: str,
    amount: int = 1,
    *,
    timeout_s: float,
    clock_ns: Callable[[], int] = time.monotonic_ns,
    lock: AbstractContextManager[Any] | None = None,
    parked: set[asyncio.Future[Verdict]] | None = None,
) -> Verdict:
    """Admit now if possible, else wait up to `timeout_s` in the tenant's queue.

    A full queue answers `queue_full` at once. A denial that waiting cannot change (its
    `retry_after_ms` is None: `policy_unknown`, `too_large`, `stopped`, a limit failing
    closed until its configuration changes) is returned at once, with its own reason and
    suspension, rather than as `deadline_exceeded` after the whole timeout. Once the
    admission stops, the waiter gets `stopped` (`Admission.stop`). Every verdict is a
    detailed one, its numbers taken as it is returned. An exception set on the parked
    future (see `parked`) is raised here.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Verdict] = loop.create_future()

    def resolve(v: Verdict) -> None:
        if not future.done():
            future.set_result(v)

    with lock or contextlib.nullcontext():
        verdict = admission.try_admit_detailed(tenant, metric, amount)
        if verdict.allowed or verdict.retry_after_ms is None or timeout_s <= 0:
            return verdict
        deadline_ns = clock_ns() + int(timeout_s * 1e9)
        waiter = admission.enqueue(tenant, metric, amount, deadline_ns, resolve)
        if waiter is None:
            return admission.detail(QUEUE_FULL, tenant, metric, amount)
    timer = loop.call_later(timeout_s, _expire, waiter, admission)
    if parked is not None:
        parked.add(future)
    try:
        verdict = await future
    finally:
        timer.cancel()
        waiter.done = True  # cancelled or resolved: the queue drops it at its next pass
        if parked is not None:
            parked.discard(future)
    with lock or contextlib.nullcontext():
        return admission.detail(verdict, tenant, metric, amount)


def _expire(waiter: Waiter, admission: Admission) -> None:
    if not waiter.done:
        waiter.done = True
        waiter.resolve(admission.deadline_verdict(waiter.tenant, waiter.metric))


class Ticker:
    """Drives `Admission.tick` on the running loop, for a process without a mesh node."""

    def __init__(self, admission: Admission, *, clock_ns: Callable[[], int] = time.monotonic_ns):
        self.admission = admission
        self.clock_ns = clock_ns
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        interval_s = self.admission.config.sync_interval_ms / 1000
        while True:
            self.admission.tick(self.clock_ns())
            await asyncio.sleep(interval_s)

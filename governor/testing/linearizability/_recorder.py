"""A recorder around the SDK's async ``Client``: each call is invoked, completed and given
its outcome in a ``History``, and answers (or raises) exactly as the SDK does.

How an SDK answer becomes an outcome: a reply is ``ok``; a denial, ``LeaseEnded``,
``AcquireTimeout`` (governord's own: nothing is held), ``NOT_FOUND``, a refused argument or
credential is ``fail`` (governord answered: it did not take effect); ``Unavailable``,
``SessionLost``, a local timeout (``call_timeout_s``), a cancellation or anything unexpected
is ``unknown`` (it may have taken effect, or may yet).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from governor.client import (
    AcquireTimeout,
    Client,
    Denied,
    GovernorClientError,
    Lease,
    LeaseEnded,
    RequestError,
    SessionLost,
    Unavailable,
)

from ._history import History

__all__ = ["Recorder", "outcome_of"]

T = TypeVar("T")


def outcome_of(exc: BaseException) -> tuple[str, str]:
    """(``fail`` or ``unknown``, the error's name) for an exception an SDK call raised."""
    if isinstance(exc, Denied):
        reason = exc.denial.get("reason")
        return "fail", str(reason) if reason else "denied"
    if isinstance(exc, LeaseEnded):
        return "fail", "lease_ended"
    if isinstance(exc, AcquireTimeout):
        return "fail", "timeout"
    if isinstance(exc, (Unavailable, SessionLost)):
        return "unknown", ""
    if isinstance(exc, RequestError) and exc.code == "NOT_FOUND":
        return "fail", "not_found"
    if isinstance(exc, GovernorClientError):
        return "fail", str(exc.detail.get("reason") or exc.code or type(exc).__name__)
    return "unknown", ""


class Recorder:
    """Record ``client``'s calls as ``name`` into ``history``. ``call_timeout_s`` gives up a
    call locally (its outcome is then unknown); ``clock`` is monotonic ns."""

    def __init__(
        self,
        client: Client,
        history: History,
        name: str,
        *,
        call_timeout_s: float | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.client = client
        self.history = history
        self.name = name
        self.call_timeout_s = call_timeout_s
        self.clock = clock

    async def _run(
        self,
        call: str,
        args: Mapping[str, Any],
        coro: Callable[[], Awaitable[T]],
        result: Callable[[T], dict[str, Any]],
    ) -> T:
        op = self.history.invoke(self.name, call, args, self.clock())
        try:
            if self.call_timeout_s is None:
                value = await coro()
            else:
                value = await asyncio.wait_for(coro(), self.call_timeout_s)
        except BaseException as exc:
            outcome, error = outcome_of(exc)
            self.history.complete(op, outcome, self.clock(), error=error)  # type: ignore[arg-type]
            raise
        self.history.complete(op, "ok", self.clock(), result=result(value))
        return value

    async def acquire(self, node_id: int, cls: str, *, timeout: float | None = None) -> Lease:
        return await self._run(
            "acquire",
            {"node_id": node_id, "cls": cls},
            lambda: self.client.acquire_at(node_id, cls, timeout),
            lambda lease: {"lease_id": lease.lease_id},
        )

    async def release(self, lease: Lease) -> bool:
        return await self._run(
            "release",
            {"lease_id": lease.lease_id},
            lambda: self.client.release(lease),
            lambda released: {"released": released},
        )

    async def validate(self, lease_id: int) -> bool:
        return await self._run(
            "validate",
            {"lease_id": lease_id},
            lambda: self.client.validate(lease_id),
            lambda live: {"live": live},
        )

    async def consume(self, node_id: int, resource: str, amount: int = 1) -> None:
        await self._run(
            "consume",
            {"node_id": node_id, "resource": resource, "amount": amount},
            lambda: self.client.consume_at(node_id, resource, amount),
            lambda _: {},
        )

    async def reserve_credit(self, node_id: int, resource: str, units: int) -> dict[str, Any]:
        return await self._run(
            "reserve_credit",
            {"node_id": node_id, "resource": resource, "units": units},
            lambda: self.client.reserve_credit(node_id, resource, units),
            lambda r: {
                "block_id": int(r["block_id"]),
                "units": int(r["units"]),
                "ttl_ms": int(r["ttl_ms"]),
            },
        )

    async def return_credit(self, block_id: int, unused: int) -> bool:
        return await self._run(
            "return_credit",
            {"block_id": block_id, "unused": unused},
            lambda: self.client.return_credit(block_id, unused),
            lambda returned: {"returned": returned},
        )

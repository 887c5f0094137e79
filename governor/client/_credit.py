"""Strict admission for one (node, resource): credit blocks from governord, spent locally.

``try_admit`` is the hot path: no network call, a decision from the blocks held
(``ratemesh.credit.CreditHolder``). Behind it, one background reserve at a time keeps the
holder above its low-water mark, and spent-out or idle blocks go back; when to ask and how
long to back off after a denial is ``ratemesh.creditloop.CreditLoop``'s, as for the mesh.
``admit`` waits for credit up to the caller's timeout, then denies: it never falls back to a
local limit. When governord cannot be reached, what is held is spent until its local expiry,
then every verdict is ``governor_unreachable`` until a reserve succeeds again.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ratemesh.credit import CreditConfig, Reserve, Spend, node_burst, node_rate, rate_burst
from ratemesh.creditloop import CreditLoop

from ._errors import Denied, GovernorClientError, SessionLost, Unavailable

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["StrictCredit"]


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _instant() -> int:
    """A clock reading that spreads the wait after a drained bucket (`drained_wait_ms`)."""
    return time.monotonic_ns()


class StrictCredit:
    """``async with StrictCredit(client, node_id, "http") as credit: credit.try_admit()``."""

    def __init__(
        self,
        client: Client,
        node_id: int,
        resource: str,
        config: CreditConfig | None = None,
    ) -> None:
        self.client = client
        self.node_id = node_id
        self.resource = resource
        self.loop = CreditLoop(config)
        self.holder = self.loop.holder
        self._reserving: asyncio.Task[None] | None = None
        self._returning: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self.reserves = 0  # round trips, for "round trips per admitted unit"
        self.returns = 0
        self.rate_lookups = 0  # GetNode calls for the node's burst (one, before the first reserve)
        self._looked_up = False

    async def __aenter__(self) -> StrictCredit:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the hot path --------------------------------------------------------------------

    def try_admit(self, units: int = 1) -> Spend:
        """A verdict now, from what is held; starts a refill or a return in the background."""
        now = _now_ms()
        verdict = self.holder.try_spend(now, units)
        self._maintain(now)
        return verdict

    async def admit(self, units: int = 1, timeout_s: float = 0.0) -> Spend:
        """Wait up to ``timeout_s`` for credit, then deny with the last verdict's reason."""
        give_up = time.monotonic() + timeout_s
        while True:
            changed = self._changed
            verdict = self.try_admit(units)
            left = give_up - time.monotonic()
            if verdict.admitted or left <= 0:
                return verdict
            wait_s = left
            if self._reserving is None:  # backing off after a denial: look again then
                wait_s = min(left, max(0.001, (self.loop.retry_at_ms - _now_ms()) / 1000))
            try:
                await asyncio.wait_for(changed.wait(), wait_s)
            except TimeoutError:
                pass

    # ---- behind it -----------------------------------------------------------------------

    def _maintain(self, now: int) -> None:
        if self._reserving is None:
            request = self.loop.ahead(now, ahead=False)
            if request is not None:
                self._reserving = asyncio.get_running_loop().create_task(self._reserve(request))
        returns = self.loop.returns(now)
        if returns:
            task = asyncio.get_running_loop().create_task(self._give_back(returns))
            self._returning.add(task)
            task.add_done_callback(self._returning.discard)

    async def _reserve(self, request: Reserve) -> None:
        try:
            if not self._looked_up:
                await self._learn_burst()  # once, before the first block is asked for
            self.reserves += 1
            reply = await self.client.reserve_credit(self.node_id, self.resource, request.units)
        except Denied as exc:
            # an empty bucket's denial states its B (`rate_burst`): the loop waits as after a
            # partial grant, and sizes blocks within a share of it
            self.loop.denied(_now_ms(), request, rate_burst(exc.denial), instant=_instant())
        except (Unavailable, SessionLost):
            self.loop.unreachable(_now_ms(), request)
        except BaseException:
            self.loop.abandon(request)
            raise
        else:
            try:
                block_id, units, ttl_ms = reply["block_id"], reply["units"], reply["ttl_ms"]
            except (KeyError, TypeError):  # a reply that does not fit: hold nothing
                self.loop.abandon(request)
            else:
                self.loop.granted(_now_ms(), request, block_id, units, ttl_ms, instant=_instant())
        finally:
            self._reserving = None
            old, self._changed = self._changed, asyncio.Event()
            old.set()

    async def _learn_burst(self) -> None:
        """Once, before the first reserve: read the node's rate, so blocks stay a share of its
        burst B (a rate on an ancestor is learned from its denials instead)."""
        self._looked_up = True
        self.rate_lookups += 1
        try:
            info = await self.client.get_node(self.node_id)
        except GovernorClientError:
            self._looked_up = False  # read again after the next answer
            return
        burst = node_burst(info, self.resource)
        if burst is not None:
            self.holder.learn_burst(burst, node_rate(info, self.resource))

    async def _give_back(self, returns: list[tuple[int, int]]) -> None:
        for block_id, unused in returns:
            try:
                await self.client.return_credit(block_id, unused)
                self.returns += 1
            except GovernorClientError:
                pass  # the block stays counted until it expires: safe, only slower to refill

    async def close(self) -> None:
        """Give back everything held (the worker is leaving) and wait for the calls."""
        if self._reserving is not None:
            self._reserving.cancel()
            try:
                await self._reserving
            except (asyncio.CancelledError, GovernorClientError):
                pass
        returns = self.loop.returns(_now_ms(), leaving=True)
        if returns:
            await self._give_back(returns)
        if self._returning:
            await asyncio.gather(*self._returning, return_exceptions=True)

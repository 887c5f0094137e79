"""Strict admission for one (node, resource): credit blocks from governord, spent locally.

``try_admit`` is the hot path: no network call, a decision from the blocks held
(``ratemesh.credit.CreditHolder``). Behind it, one background reserve at a time keeps the
holder above its low-water mark, and spent-out or idle blocks go back. ``admit`` waits for
credit up to the caller's timeout, then denies: it never falls back to a local limit. When
governord cannot be reached, what is held is spent until its local expiry, then every verdict
is ``governor_unreachable`` until a reserve succeeds again.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ratemesh.credit import (
    DENIED_BACKOFF_MAX_MS,
    CreditConfig,
    CreditHolder,
    Reserve,
    Spend,
    denied_backoff_ms,
    drained_wait_ms,
    node_burst,
    rate_burst,
)
from ratemesh.errors import ConfigError

from ._errors import Denied, GovernorClientError, SessionLost, Unavailable

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["StrictCredit"]


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


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
        self.holder = CreditHolder(config)
        self._reserving: asyncio.Task[None] | None = None
        self._returning: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._backoff_ms = 0
        self._retry_at_ms = 0
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
                wait_s = min(left, max(0.001, (self._retry_at_ms - _now_ms()) / 1000))
            try:
                await asyncio.wait_for(changed.wait(), wait_s)
            except TimeoutError:
                pass

    # ---- behind it -----------------------------------------------------------------------

    def _maintain(self, now: int) -> None:
        if self._reserving is None and now >= self._retry_at_ms:
            request = self.holder.refill(now)
            if request is not None:
                self._reserving = asyncio.get_running_loop().create_task(self._reserve(request))
        returns = self.holder.take_returns(now)
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
            # an empty bucket's denial states its B: blocks stay a share of it, and the next
            # ask waits lead_ms like a partial grant (mesh.core's CreditDesk.failed says why)
            burst = rate_burst(exc.denial)
            self.holder.failed(request, unreachable=False, burst=burst)
            if burst is not None:
                self._backoff_ms = 0
                self._retry_at_ms = _now_ms() + self._drained_wait_ms()
            else:
                self._backoff_ms = denied_backoff_ms(self._backoff_ms)
                self._retry_at_ms = _now_ms() + self._backoff_ms
        except (Unavailable, SessionLost):
            self.holder.failed(request, unreachable=True)
            self._retry_at_ms = _now_ms() + DENIED_BACKOFF_MAX_MS
        except BaseException:
            self.holder.failed(request, unreachable=False)
            raise
        else:
            try:
                block_id, units, ttl_ms = reply["block_id"], reply["units"], reply["ttl_ms"]
                self.holder.granted(_now_ms(), request, block_id, units, ttl_ms)
            except (KeyError, ConfigError):  # a reply that does not fit: hold nothing
                self.holder.failed(request, unreachable=False)
            self._backoff_ms = 0
            if reply.get("units", 0) < request.units:
                # a partial grant: the bucket is drained, so a reserve at once would take only
                # what refilled in one round trip; waiting lead_ms gathers more per round trip
                # and costs no throughput (the bucket, not the worker, is the bottleneck)
                self._retry_at_ms = _now_ms() + self._drained_wait_ms()
        finally:
            self._reserving = None
            old, self._changed = self._changed, asyncio.Event()
            old.set()

    def _drained_wait_ms(self) -> int:
        return drained_wait_ms(self.holder.config.lead_ms, time.monotonic_ns())

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
            self.holder.learn_burst(burst)

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
        returns = self.holder.take_returns(_now_ms(), leaving=True)
        if returns:
            await self._give_back(returns)
        if self._returning:
            await asyncio.gather(*self._returning, return_exceptions=True)

"""Async waits for the record: a future per reply, resolved by the log's writer thread after
each group commit (one ``call_soon_threadsafe`` per batch, not per call), and waits for a commit
round that proves this process still leads (``confirm``: a read that must not be stale)."""

from __future__ import annotations

import asyncio
import heapq
import itertools

from governor.authority import Authority

__all__ = ["CommitWaits"]


class CommitWaits:
    """Futures resolved when the log has committed up to their sequence number."""

    def __init__(self, authority: Authority, loop: asyncio.AbstractEventLoop) -> None:
        self._log = authority.log
        self._loop = loop
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._rounds: list[tuple[int, int, asyncio.Future[None]]] = []
        self._count = itertools.count()
        self.confirm_reads = True  # False only in a planted-bug test (``_plant``)
        self._log.commit_listeners.append(self._on_commit)
        self._log.round_listeners.append(self._on_round)

    def _on_commit(self, seq: int, _n: int, _took: float) -> None:
        self._loop.call_soon_threadsafe(self._resolve, seq)

    def _on_round(self, done: int) -> None:
        self._loop.call_soon_threadsafe(self._resolve_rounds, done)

    def _resolve(self, seq: int) -> None:
        _pop_up_to(self._heap, seq)

    def _resolve_rounds(self, done: int) -> None:
        _pop_up_to(self._rounds, done)

    async def reply_ready(self, seq: int, wrote: bool) -> None:
        """Return once a step's answer may be sent: its record is durable and, for a step that
        recorded nothing (a read, a denial, a resend), the epoch has been confirmed."""
        await self.wait(seq)
        if not wrote:
            await self.confirm()

    async def confirm(self) -> None:
        """Return once a commit round that started after this call has renewed this process's
        leader row: nothing answered after it can come from a deposed leader. Immediate where
        governord runs alone (SQLite)."""
        if not self.confirm_reads:
            return
        want = self._log.want_round()
        if want == 0 or self._log.rounds_done >= want:
            return
        fut = self._loop.create_future()
        heapq.heappush(self._rounds, (want, next(self._count), fut))
        if self._log.rounds_done >= want:
            self._resolve_rounds(self._log.rounds_done)
        await fut

    async def wait(self, seq: int) -> None:
        if self._log.committed_seq >= seq:
            return
        fut = self._loop.create_future()
        heapq.heappush(self._heap, (seq, next(self._count), fut))
        if self._log.committed_seq >= seq:  # committed between the check and the push
            self._resolve(self._log.committed_seq)
        await fut


def _pop_up_to(heap: list[tuple[int, int, asyncio.Future[None]]], upto: int) -> None:
    while heap and heap[0][0] <= upto:
        _, _, fut = heapq.heappop(heap)
        if not fut.done():
            fut.set_result(None)

"""Async waits for the record: a future per reply, resolved by the log's writer thread after
each group commit (one ``call_soon_threadsafe`` per batch, not per call)."""

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
        self._count = itertools.count()
        self._log.commit_listeners.append(self._on_commit)

    def _on_commit(self, seq: int, _n: int, _took: float) -> None:
        self._loop.call_soon_threadsafe(self._resolve, seq)

    def _resolve(self, seq: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= seq:
            _, _, fut = heapq.heappop(heap)
            if not fut.done():
                fut.set_result(None)

    async def wait(self, seq: int) -> None:
        if self._log.committed_seq >= seq:
            return
        fut = self._loop.create_future()
        heapq.heappush(self._heap, (seq, next(self._count), fut))
        if self._log.committed_seq >= seq:  # committed between the check and the push
            self._resolve(self._log.committed_seq)
        await fut

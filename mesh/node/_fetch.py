"""Policy fetches: the owner's FetchPolicy effects, answered by polling the coordinator.

They queue here (deduplicated) for one fetcher task, which answers every queued key with
one coordinator poll. The owner asks for at most FETCHING_MAX keys at once, so the queue
holds no more; a key still unknown after its poll (or with no coordinator to ask) is held
back for a retry delay before the owner may ask again, in a deque bounded by the same number.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from mesh.coordinator import PolicyFeed
from mesh.core.member import Member
from mesh.core.owner._owner import FETCHING_MAX
from mesh.core.policy import RateKey

__all__ = ["PolicyFetches", "FETCH_QUEUE_MAX", "FETCH_TIMEOUT_S", "FETCH_GAP_S"]

log = logging.getLogger("mesh.node")
NS = 1_000_000_000
FETCH_QUEUE_MAX = FETCHING_MAX
FETCH_TIMEOUT_S = 5.0  # one coordinator poll on behalf of the queued keys
FETCH_GAP_S = 0.1  # between two such polls: a flood of unknown keys is not a poll storm
NO_COORDINATOR_RETRY_S = 1.0  # nothing to ask: refuse the key this long, then let it ask


class PolicyFetches:
    """The keys the owner asked to fetch, the fetcher that answers them, and the keys held
    back after a failed fetch. Every key asked for is answered (`Owner.policy_learned`)."""

    def __init__(
        self,
        member: Member,
        lock: AbstractContextManager[Any],
        feed: PolicyFeed | None,
        clock_ns: Callable[[], int],
    ) -> None:
        self.member = member
        self.lock = lock
        self.feed = feed
        self.clock_ns = clock_ns
        self.closing = False  # the node is leaving: nothing more is queued for a poll
        # Keys the owner asked to fetch (FetchPolicy), in order, each once; the fetcher's
        # event; keys held back after a failed fetch, as (release ns, key), oldest first.
        self._queue: dict[RateKey, None] = {}
        self._wake = asyncio.Event()
        self._held: deque[tuple[int, RateKey]] = deque()
        retry_s = feed.poll_ttl_s if feed is not None else NO_COORDINATOR_RETRY_S
        self._retry_ns = int(retry_s * NS)
        self.fetch_polls = 0  # coordinator polls made for the owner's unknown keys

    def want(self, now: int, key: RateKey) -> None:
        """The owner lacks `key`'s generation: queue it for the fetcher (once), or hold it
        back for a retry delay when there is no coordinator to ask or the node is closing.
        A key that fits nowhere is answered at once: the owner may ask again later."""
        queue = self._queue
        if key in queue:
            return  # coalesced: the queued fetch answers this one too
        if self.feed is not None and not self.closing and len(queue) < FETCH_QUEUE_MAX:
            queue[key] = None
            self._wake.set()
        elif len(self._held) < FETCH_QUEUE_MAX:
            self._held.append((now + self._retry_ns, key))
        else:
            self._learned([key])

    async def run(self, feed: PolicyFeed) -> None:
        """The one fetch task: answer every queued key with one coordinator poll (bounded
        by FETCH_TIMEOUT_S, at most one per FETCH_GAP_S). Whatever the outcome (learned,
        unknown, failed, timed out, cancelled) every key taken is answered: learned ones at
        once, the rest after the retry delay (`release`)."""
        queue = self._queue
        while True:
            await self._wake.wait()
            self._wake.clear()
            while queue:
                keys = list(queue)  # arriving meanwhile: left queued, for the next poll
                try:
                    if any(self.member.policies.get(k) is None for k in keys):
                        self.fetch_polls += 1
                        await asyncio.wait_for(feed.poll(), FETCH_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001 - any failure is "still unknown"
                    log.warning("policy fetch for %d keys failed: %r", len(keys), exc)
                finally:
                    self._answer_fetched(keys)
                await asyncio.sleep(FETCH_GAP_S)

    def release(self, now: int | None) -> None:
        """Answer the held keys whose retry delay ran out by `now` (all of them, and the
        queued ones too, with `now` None: the node is closing and the fetcher is gone)."""
        held = self._held
        if now is not None and not (held and held[0][0] <= now):
            return  # the tick's common case
        keys: list[RateKey] = []
        while held and (now is None or held[0][0] <= now):
            keys.append(held.popleft()[1])
        if now is None:
            keys.extend(self._queue)
            self._queue.clear()
        self._learned(keys)

    def _answer_fetched(self, keys: list[RateKey]) -> None:
        """A poll on behalf of `keys` ended: those now known may be asked for again at
        once; the rest are held back for the retry delay."""
        now = self.clock_ns()
        policies, held = self.member.policies, self._held
        known: list[RateKey] = []
        for key in keys:
            self._queue.pop(key, None)
            if policies.get(key) is not None or len(held) >= FETCH_QUEUE_MAX:
                known.append(key)
            else:
                held.append((now + self._retry_ns, key))
        self._learned(known)

    def _learned(self, keys: list[RateKey]) -> None:
        if keys:
            with self.lock:
                for key in keys:
                    self.member.owner.policy_learned(key)

"""The simulated downstream of the scenario benchmarks: an asyncio service with a capacity.

A request that arrives while ``capacity`` requests are in flight is shed (503) after
``reject_ms``, and it occupies a slot while it is being turned away, as a real overloaded
server spends work on refusals: the more excess load, the fewer requests are served.
``capacity=None`` never sheds; ``down=True`` fails every request.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["Downstream", "DownstreamDown"]


class DownstreamDown(ConnectionError):
    """The downstream is down (the retry storm)."""


class Downstream:
    def __init__(
        self,
        capacity: int | None = None,
        service_ms: float = 5.0,
        reject_ms: float = 1.0,
        *,
        down: bool = False,
    ) -> None:
        self.capacity = capacity
        self.service_ms = service_ms
        self.reject_ms = reject_ms
        self.down = down
        self.inflight = 0
        self.peak = 0
        self.sent = 0
        self.served = 0
        self.shed = 0
        self.log: list[tuple[float, bool]] = []  # (monotonic time, served?)

    async def call(self) -> int:
        self.sent += 1
        if self.down:
            await asyncio.sleep(0)
            raise DownstreamDown("downstream is down")
        over = self.capacity is not None and self.inflight >= self.capacity
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            await asyncio.sleep((self.reject_ms if over else self.service_ms) / 1000)
        finally:
            self.inflight -= 1
        self.log.append((time.monotonic(), not over))
        if over:
            self.shed += 1
            return 503
        self.served += 1
        return 200

    def window(self, start: float, end: float) -> tuple[int, int]:
        """(served, shed) of requests that finished in [start, end)."""
        served = sum(1 for t, ok in self.log if start <= t < end and ok)
        shed = sum(1 for t, ok in self.log if start <= t < end and not ok)
        return served, shed

"""Memory a node gives back: what refused streams leave in reference cycles, and the heap.

A stream refused for a bad message leaves the message in reference cycles (exceptions'
tracebacks hold the frames that hold the bytes), and the raised GC thresholds of a node
(`tune_gc`) collect young objects only after 50,000 allocations, which an idle node takes
long to make: 600 refused 1 MiB messages held 1.2 GB. Every REFUSED_CHECK_S a task reads
the transport's count of refused streams; when it grew, it collects generation 0, lets the
loop turn REFUSED_FINALIZE_TURNS times and collects generation 1. The first collection runs
the garbage's finalizers, and those of the streams' unfinished async generators schedule
their `aclose()` on the loop, which keeps the garbage alive (moved up to generation 1) until
it ran; the second frees it there. Their cost is bounded by the thresholds (young objects),
not by the keys held. A stream still finishing during a collection is moved up instead, and
may reach the oldest generation: once refusals stop for REFUSED_QUIET_S, one full collection
frees it, at most once per REFUSED_FULL_NS (its cost grows with the keys held: 0.3 s at
125,000 owned keys). Then, at most once per REFUSED_TRIM_NS, the freed heap goes back to the
OS (`trim_heap`).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from collections.abc import Callable

from mesh.peer import Transport

__all__ = ["RefusedCollector", "trim_heap"]

NS = 1_000_000_000
REFUSED_CHECK_S = 0.25
REFUSED_FINALIZE_TURNS = 4
REFUSED_QUIET_S = 1.0
REFUSED_FULL_NS = 30 * NS
REFUSED_TRIM_NS = NS


class RefusedCollector:
    """Collects what refused streams left in cycles, and trims the heap after (`run`)."""

    def __init__(self, transport: Transport, clock_ns: Callable[[], int]) -> None:
        self.transport = transport
        self.clock_ns = clock_ns
        started_ns = clock_ns()
        self._refused_seen = 0  # the transport's refused streams, when last looked at
        self._trim_at_ns = started_ns  # the next heap trim after refusals, not sooner
        self._trim_owed = False
        self._full_owed = False  # refusals since the last full collection
        self._full_at_ns = started_ns  # the next full collection, not sooner
        self._refused_at_ns = 0  # when the refused count last grew
        self.refused_collections = 0  # young collections run because streams were refused
        self.refused_full_collections = 0

    async def run(self) -> None:
        """The node's task: look every REFUSED_CHECK_S (the module docstring says how)."""
        while True:
            await asyncio.sleep(REFUSED_CHECK_S)
            now = self.clock_ns()
            refused = self.transport.stats().get("refused_streams", 0)
            if refused != self._refused_seen:
                self._refused_seen = refused
                self._refused_at_ns = now
                await _collect_young()
                self.refused_collections += 1
                self._trim_owed = self._full_owed = True
            elif (
                self._full_owed
                and now - self._refused_at_ns >= REFUSED_QUIET_S * NS
                and now >= self._full_at_ns
            ):
                self._full_owed = False
                self._full_at_ns = now + REFUSED_FULL_NS
                await _collect_young()
                gc.collect()
                for _ in range(REFUSED_FINALIZE_TURNS):
                    await asyncio.sleep(0)
                gc.collect()
                self.refused_full_collections += 1
                self._trim_owed = True
            if self._trim_owed and now >= self._trim_at_ns:
                self._trim_owed = False
                self._trim_at_ns = now + REFUSED_TRIM_NS
                trim_heap()


async def _collect_young() -> None:
    """Collect generations 0 and 1, letting the loop run the finalizers' `aclose()`s
    in between (the module docstring says why)."""
    gc.collect(0)
    for _ in range(REFUSED_FINALIZE_TURNS):
        await asyncio.sleep(0)
    gc.collect(1)
    for _ in range(REFUSED_FINALIZE_TURNS):
        await asyncio.sleep(0)


def trim_heap() -> None:
    """Return the C heap's free pages to the OS (glibc's malloc_trim): after many tenants
    went idle their memory is free but the allocator keeps it. Elsewhere, nothing."""
    try:
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # this process's symbols
    except OSError:
        return
    if trim is not None:
        trim(0)

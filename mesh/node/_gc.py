"""Garbage-collector thresholds for a process that runs a busy owner.

An owner builds a few short-lived tuples per report and per snapshot, hundreds of
thousands a second, while it holds a large, long-lived graph of keys and reporter records.
With CPython's default thresholds (700, 10, 10) that allocation rate triggers a young
collection every few hundred microseconds and a full walk of the long-lived graph every few
milliseconds: about a fifth of an owner's time in `mesh bench owner`. The short-lived
tuples hold no cycles, so collecting less often costs memory only briefly.
"""

from __future__ import annotations

import gc

__all__ = ["tune_gc", "GC_THRESHOLDS"]

GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> tuple[int, int, int]:
    """Raise the collector's thresholds (process-wide); returns the previous ones.

    `mesh node` calls it. An app that embeds `Mesh` decides for its own process: call it
    at start-up if the node owns many busy keys.
    """
    before = gc.get_threshold()
    gc.set_threshold(*thresholds)
    return before  # type: ignore[return-value]

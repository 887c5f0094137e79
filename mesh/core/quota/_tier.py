"""The cell tier: a shared store of the workers' cells beside the owners' folds (seed 002's
Redis hash), behind a one-method Protocol so the core, the simulator and tests run it in
memory and the node runs it on Redis (`mesh.sharedstate._cells`).

One call does what seed 002's flush does atomically: set this worker's field to
max(old, new) with a beat, drop fields whose beat is older than the retention, and return
every field left. The store's clock beats (Redis's own server clock), so workers need not
agree on time; the in-memory store takes the caller's.
"""

from __future__ import annotations

from typing import Protocol

from mesh.core.policy import RateKey
from mesh.core.quota._fold import CELL_RETENTION_MS, CELLS_PER_KEY_MAX, QUOTA_KEYS_MAX

__all__ = ["CellTier", "MemoryCellTier"]


class CellTier(Protocol):
    def exchange(
        self, now_ms: int, key: RateKey, period_index: int, member: str, burn: int
    ) -> dict[str, int]:
        """Write `member`'s cell as max(old, burn), age out stale fields, return all."""
        ...

    def forget_member(self, member: str) -> int:
        """Purge a decommissioned member's cells by name; the cells dropped."""
        ...


class MemoryCellTier:
    """The tier in memory: one dict per (key, period), beats on the caller's clock."""

    def __init__(
        self,
        *,
        retention_ms: int = CELL_RETENTION_MS,
        keys_max: int = QUOTA_KEYS_MAX,
        cells_max: int = CELLS_PER_KEY_MAX,
    ) -> None:
        self.retention_ms = retention_ms
        self.keys_max = keys_max
        self.cells_max = cells_max
        self._hashes: dict[tuple[RateKey, int], dict[str, tuple[int, int]]] = {}

    def exchange(
        self, now_ms: int, key: RateKey, period_index: int, member: str, burn: int
    ) -> dict[str, int]:
        k = (key, period_index)
        h = self._hashes.get(k)
        if h is None:
            if len(self._hashes) >= self.keys_max:
                self._drop_past(period_index)
            h = self._hashes.setdefault(k, {})
        old = h.get(member)
        if old is not None or len(h) < self.cells_max:
            h[member] = (max(burn, 0 if old is None else old[0]), now_ms)
        horizon = now_ms - self.retention_ms
        for m in [m for m, (_, beat) in h.items() if beat < horizon]:
            del h[m]
        return {m: b for m, (b, _) in sorted(h.items())}

    def forget_member(self, member: str) -> int:
        dropped = 0
        for h in self._hashes.values():
            dropped += h.pop(member, None) is not None
        return dropped

    def _drop_past(self, index: int) -> None:
        """At the bound, hashes of earlier periods go first (Redis expires them by TTL)."""
        for k in [k for k in self._hashes if k[1] < index]:
            del self._hashes[k]

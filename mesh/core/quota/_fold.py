"""The owner's side of spend-quota convergence: fold the workers' cells (docs/quotas.md).

Per (RateKey, period index) the owner keeps one cell per member, the member's cumulative
burn and the owner-clock time it last heard it (its beat). A publish sets the cell to
max(old, new): cells are a G-counter, so a duplicate, a reordered or retried publish, or a
restart under the same member id adds nothing. The fold is the sum of the live cells.

The cell a publish writes is the sender's: the driver passes the stream's authenticated
member id, never one the message claims. A cell above the key's quota (no worker admits
past its cap) or of a period the owner's own clock does not hold is refused and counted.

A cell whose beat is older than CELL_RETENTION_MS is dropped from the fold: a departed
worker's burn leaves the fold after one retention window, which is also how long a worker
back under a new id double-counts. A new owner (crash, ring change) starts empty and is
rebuilt by the workers' next publishes, which are cumulative, so nothing is lost while the
worker that burned it lives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mesh.core.messages import Cell, CellFold, CellPublish, FoldRow
from mesh.core.policy import RateKey
from mesh.core.quota._period import period_index
from ratemesh.policy import Period

__all__ = [
    "CELL_RETENTION_MS",
    "PERIOD_SKEW_MAX",
    "QUOTA_KEYS_MAX",
    "CELLS_PER_KEY_MAX",
    "QuotaFolds",
]

# A departed worker's cell leaves the fold this long after its last publish (seed 002).
CELL_RETENTION_MS = 600_000
# Periods either side of the owner's own that a cell may name: a worker whose clock sits a
# little across a boundary still counts (in its own period's fold), a wild claim does not.
PERIOD_SKEW_MAX = 1
# (key, period) folds one owner holds; past it a new one is refused (counted), never evicted
# silently: an evicted fold would forget burn and over-admit.
QUOTA_KEYS_MAX = 65_536
# Members' cells per fold: a fleet larger than this cannot publish to one owner.
CELLS_PER_KEY_MAX = 1024

# (quota, period) of a key's policy, None: not known here or not a quota policy.
Quotas = Callable[[RateKey], tuple[int, Period] | None]


@dataclass(slots=True)
class _Fold:
    cells: dict[str, list[int]] = field(default_factory=dict)  # member -> [burn, beat_ms]
    total: int = 0


class QuotaFolds:
    """Every (key, period) fold this owner holds, fed by `publish` and aged by `expire`."""

    def __init__(
        self,
        member_id: str,
        quotas: Quotas,
        *,
        retention_ms: int = CELL_RETENTION_MS,
        keys_max: int = QUOTA_KEYS_MAX,
        cells_max: int = CELLS_PER_KEY_MAX,
    ) -> None:
        self.member_id = member_id
        self._quotas = quotas
        self.retention_ms = retention_ms
        self.keys_max = keys_max
        self.cells_max = cells_max
        self._folds: dict[tuple[RateKey, int], _Fold] = {}
        self.refused: dict[str, int] = {}  # reason -> cells refused (counted, not applied)

    def __len__(self) -> int:
        return len(self._folds)

    def publish(self, now_ms: int, sender: str, msg: CellPublish) -> CellFold:
        """Take `sender`'s cells (the authenticated member) and answer with the folds.
        `now_ms` is this owner's wall clock (epoch ms): the cells' beats and the period its
        policy is in. Refused cells get no row and change nothing."""
        rows = []
        for c in msg.cells:
            reason = self._check(now_ms, c)
            if reason is None:
                reason = self._apply(now_ms, sender, c)
            if reason is not None:
                self.refused[reason] = self.refused.get(reason, 0) + 1
                continue
            fold = self._folds[(c.rate_key, c.period_index)]
            rows.append(FoldRow(c.rate_key, c.period_index, fold.total, fold.cells[sender][0]))
        return CellFold(self.member_id, msg.ring_epoch, tuple(rows))

    def _current(self, now_ms: int, key: RateKey) -> int | None:
        q = self._quotas(key)
        return None if q is None else period_index(q[1], now_ms)

    def _check(self, now_ms: int, c: Cell) -> str | None:
        q = self._quotas(c.rate_key)
        if q is None:
            return "not_a_quota"
        cap, period = q
        if abs(c.period_index - period_index(period, now_ms)) > PERIOD_SKEW_MAX:
            return "period_out_of_range"
        if c.burn > cap:
            return "burn_above_quota"  # no worker admits past its cap: not valid usage
        return None

    def _apply(self, now_ms: int, sender: str, c: Cell) -> str | None:
        k = (c.rate_key, c.period_index)
        fold = self._folds.get(k)
        if fold is None:
            if len(self._folds) >= self.keys_max:
                return "quota_keys_full"
            fold = self._folds[k] = _Fold()
        cell = fold.cells.get(sender)
        if cell is None:
            if len(fold.cells) >= self.cells_max:
                return "cells_full"
            fold.cells[sender] = [c.burn, now_ms]
            fold.total += c.burn
        else:
            if c.burn > cell[0]:  # max(old, new): a G-counter, never a second copy
                fold.total += c.burn - cell[0]
                cell[0] = c.burn
            cell[1] = max(cell[1], now_ms)
        return None

    def fold(self, key: RateKey, period_index: int) -> tuple[int, dict[str, int]]:
        """(combined, cells by member) for one fold: for /health and tests."""
        f = self._folds.get((key, period_index))
        if f is None:
            return 0, {}
        return f.total, {m: c[0] for m, c in sorted(f.cells.items())}

    def expire(self, now_ms: int) -> int:
        """Drop cells past retention, folds more than PERIOD_SKEW_MAX periods past (or whose
        key is no quota here any more) and folds left empty; the cells dropped. A period
        just past keeps a late (skewed) worker's cells until they age out: no one
        publishes it after the boundary, so it is gone one retention window later."""
        dropped = 0
        horizon = now_ms - self.retention_ms
        for k in list(self._folds):
            fold = self._folds[k]
            current = self._current(now_ms, k[0])
            if current is None or k[1] < current - PERIOD_SKEW_MAX:
                dropped += len(fold.cells)
                del self._folds[k]
                continue
            for m in [m for m, c in fold.cells.items() if c[1] < horizon]:
                fold.total -= fold.cells.pop(m)[0]
                dropped += 1
            if not fold.cells:
                del self._folds[k]
        return dropped

    def forget_member(self, member: str) -> int:
        """Purge a decommissioned member's cells by name (seed 002); cells dropped."""
        dropped = 0
        for k in list(self._folds):
            fold = self._folds[k]
            cell = fold.cells.pop(member, None)
            if cell is not None:
                fold.total -= cell[0]
                dropped += 1
                if not fold.cells:
                    del self._folds[k]
        return dropped

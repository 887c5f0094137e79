"""Spend-quota cells on the wire (docs/quotas.md): a worker's `CellPublish` of its
own cumulative burn per (RateKey, period), and the owner's `CellFold` answer.

A cell is an absolute value, not a delta: the owner keeps max(old, new) per (key, period,
member), so a retried, duplicated or reordered publish, or a restart under the same member
id, never counts twice. Everything here is a peer's claim and is bounded before anything
keys a map by it: rows per message, a period index in range, a burn in [0, BURN_MAX].
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh.core._validate import INT_MAX, check_int, check_str
from mesh.core.policy import RateKey
from mesh.errors import MessageError, MessageTypeError

__all__ = [
    "BURN_MAX",
    "CELL_ROWS_MAX",
    "PERIOD_INDEX_MAX",
    "Cell",
    "CellPublish",
    "FoldRow",
    "CellFold",
]

# Cells (or fold rows) in one message: decoded and applied whole on the node's loop, as the
# report batches are (REPORT_ROWS_MAX); a worker with more quota keys sends more messages.
CELL_ROWS_MAX = 256
# A burn no policy could allow: a quota is at most INT_MAX (ratemesh.checks), and a cell
# above its cap is refused by the owner against the policy it knows (QuotaFolds).
BURN_MAX = INT_MAX
# Period indexes are days or months since the epoch (mesh.core.quota); a far-future claim
# is refused here, a near one by the owner's own clock (PERIOD_SKEW_MAX).
PERIOD_INDEX_MAX = 1 << 32


def _check_key(field: str, value: object) -> None:
    if type(value) is not RateKey:
        raise MessageTypeError(field, "must be a RateKey")


@dataclass(frozen=True, slots=True)
class Cell:
    """One worker's cumulative burn for `rate_key` in period `period_index`."""

    rate_key: RateKey
    period_index: int
    burn: int

    def __post_init__(self) -> None:
        _check_key("rate_key", self.rate_key)
        check_int("period_index", self.period_index, maximum=PERIOD_INDEX_MAX, error=MessageError)
        check_int("burn", self.burn, maximum=BURN_MAX, error=MessageError)


@dataclass(frozen=True, slots=True)
class CellPublish:
    """A worker's own cells, to the owner of each key. `sender` must be the stream's
    authenticated member (mesh.peer checks it): a sender writes only its own cell."""

    sender: str
    ring_epoch: int
    cells: tuple[Cell, ...]

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        _rows("cells", self.cells, Cell)
        seen: set[tuple[RateKey, int]] = set()
        for i, c in enumerate(self.cells):
            k = (c.rate_key, c.period_index)
            if k in seen:
                raise MessageError(f"cells[{i}]", "repeats a (rate_key, period_index)")
            seen.add(k)


@dataclass(frozen=True, slots=True)
class FoldRow:
    """The owner's fold of one (key, period): the combined burn of every live cell, and
    the receiver's own cell as the owner holds it (how a restarted worker recovers)."""

    rate_key: RateKey
    period_index: int
    combined: int
    own: int

    def __post_init__(self) -> None:
        _check_key("rate_key", self.rate_key)
        check_int("period_index", self.period_index, maximum=PERIOD_INDEX_MAX, error=MessageError)
        check_int("combined", self.combined, error=MessageError)
        check_int("own", self.own, maximum=self.combined, error=MessageError)


@dataclass(frozen=True, slots=True)
class CellFold:
    """An owner's answer to one CellPublish: a row per cell it took."""

    sender: str
    ring_epoch: int
    rows: tuple[FoldRow, ...]

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        _rows("rows", self.rows, FoldRow)


def _rows(field: str, rows: object, kind: type) -> None:
    if type(rows) is not tuple:
        raise MessageTypeError(field, f"must be a tuple of {kind.__name__}")
    if len(rows) > CELL_ROWS_MAX:
        raise MessageError(field, f"at most {CELL_ROWS_MAX} per message, got {len(rows)}")
    for i, r in enumerate(rows):
        if not isinstance(r, kind):
            raise MessageTypeError(f"{field}[{i}]", f"must be a {kind.__name__}")

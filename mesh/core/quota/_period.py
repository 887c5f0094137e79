"""UTC calendar periods as integer indexes, from the wall clock the driver passes in.

The core reads no clock: `now_ms` is epoch milliseconds from the driver (the node's wall
clock, the simulator's virtual one). A day is index `now_ms // DAY_MS`; a month is
`12 * (year - 1970) + month - 1`. Both grow by one at each UTC boundary, so "a past
period" is a smaller index and roll-over is a comparison.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ratemesh.policy import Period

__all__ = ["DAY_MS", "period_index", "period_end_ms"]

DAY_MS = 86_400_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def period_index(period: Period, now_ms: int) -> int:
    """The index of the `period` that holds `now_ms` (epoch ms, UTC)."""
    if period is Period.DAY:
        return now_ms // DAY_MS
    t = _EPOCH + timedelta(milliseconds=now_ms)
    return 12 * (t.year - 1970) + t.month - 1


def period_end_ms(period: Period, index: int) -> int:
    """The epoch ms at which period `index` ends (the next one starts): a quota's reset."""
    if period is Period.DAY:
        return (index + 1) * DAY_MS
    year, month = divmod(index + 1, 12)
    end = datetime(1970 + year, month + 1, 1, tzinfo=UTC)
    return (end - _EPOCH) // timedelta(milliseconds=1)

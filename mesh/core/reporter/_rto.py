"""When to resend an unacknowledged report: an adaptive timeout per owner (RFC 6298).

The peer stream is reliable, so a report goes unacknowledged because its owner is slow, the
link broke, or the ring moved. A fixed, short resend timer turns a slow owner into a busier
one: under load every report goes out twice, then three times. So the timeout follows the
measured report-to-acknowledgement time per owner (smoothed, plus four deviations); only
unambiguous samples count (reports sent once: Karn); and a timeout that fires doubles the
owner's timeout until a clean sample arrives (RFC 6298, 5.5), so new reports to an owner that
is falling behind are not sent twice as well. Bounds: `report_retry_ms`..`report_retry_max_ms`.
"""

from __future__ import annotations

__all__ = ["RetryTimer"]

_SHIFT_MAX = 16


class RetryTimer:
    __slots__ = ("min_ns", "max_ns", "_srtt", "_rttvar", "_shift", "_fired_at")

    def __init__(self, min_ns: int, max_ns: int) -> None:
        self.min_ns = min_ns
        self.max_ns = max_ns
        self._srtt: dict[str, int] = {}
        self._rttvar: dict[str, int] = {}
        self._shift: dict[str, int] = {}  # timeouts fired since the last clean sample
        self._fired_at: dict[str, int] = {}

    def sample(self, owner: str, rtt_ns: int) -> None:
        """A report sent once to `owner` was acknowledged `rtt_ns` after it was sent."""
        self._shift.pop(owner, None)
        srtt = self._srtt.get(owner)
        if srtt is None:
            self._srtt[owner] = rtt_ns
            self._rttvar[owner] = rtt_ns // 2
            return
        var = self._rttvar[owner]
        self._rttvar[owner] = var + (abs(srtt - rtt_ns) - var) // 4
        self._srtt[owner] = srtt + (rtt_ns - srtt) // 8

    def fired(self, owner: str, now_ns: int) -> None:
        """A resend to `owner` was due: back off (once per flush, however many were due)."""
        if self._fired_at.get(owner) != now_ns:
            self._fired_at[owner] = now_ns
            self._shift[owner] = min(self._shift.get(owner, 0) + 1, _SHIFT_MAX)

    def timeout_ns(self, owner: str) -> int:
        srtt = self._srtt.get(owner)
        rto = self.min_ns if srtt is None else max(self.min_ns, srtt + 4 * self._rttvar[owner])
        rto <<= self._shift.get(owner, 0)
        return self.max_ns if rto > self.max_ns else rto

    def forget(self, owner: str) -> None:
        for table in (self._srtt, self._rttvar, self._shift, self._fired_at):
            table.pop(owner, None)

"""When to resend an unacknowledged report: an adaptive timeout per owner (RFC 6298).

The peer stream is reliable, so a report goes unacknowledged because its owner is slow, the
link broke, or the ring moved. A fixed, short resend timer turns a slow owner into a busier
one: under load, every report goes out twice, then three times. So the timeout follows the
measured report-to-acknowledgement time per owner (smoothed, plus four deviations), only
unambiguous samples count (reports sent once: Karn), and each resend of the same report
doubles its wait, between `report_retry_ms` and `report_retry_max_ms`.
"""

from __future__ import annotations

__all__ = ["RetryTimer"]


class RetryTimer:
    __slots__ = ("min_ns", "max_ns", "_srtt", "_rttvar")

    def __init__(self, min_ns: int, max_ns: int) -> None:
        self.min_ns = min_ns
        self.max_ns = max_ns
        self._srtt: dict[str, int] = {}
        self._rttvar: dict[str, int] = {}

    def sample(self, owner: str, rtt_ns: int) -> None:
        """A report sent once to `owner` was acknowledged `rtt_ns` after it was sent."""
        srtt = self._srtt.get(owner)
        if srtt is None:
            self._srtt[owner] = rtt_ns
            self._rttvar[owner] = rtt_ns // 2
            return
        var = self._rttvar[owner]
        self._rttvar[owner] = var + (abs(srtt - rtt_ns) - var) // 4
        self._srtt[owner] = srtt + (rtt_ns - srtt) // 8

    def timeout_ns(self, owner: str) -> int:
        srtt = self._srtt.get(owner)
        if srtt is None:
            return self.min_ns
        rto = srtt + 4 * self._rttvar[owner]
        return self.min_ns if rto < self.min_ns else self.max_ns if rto > self.max_ns else rto

    def backoff_ns(self, owner: str, sends: int) -> int:
        """How long after its last send a report sent `sends` times is sent again."""
        return min(self.timeout_ns(owner) << (sends - 1 if sends > 1 else 0), self.max_ns)

    def forget(self, owner: str) -> None:
        self._srtt.pop(owner, None)
        self._rttvar.pop(owner, None)

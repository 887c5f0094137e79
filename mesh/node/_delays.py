"""How long the mesh takes to answer, as this node sees it: the report delay (a report
sent to its acknowledgement) and the snapshot delay (the age of a key's view when the next
snapshot lands), per metric, and the recent report delays `d` is estimated from.

Both maps are keyed by RateKey and bounded: cleared when DELAY_TRACK_MAX keys are being
timed, and what was untouched for a forget period is dropped (`forget_idle`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from mesh.core.messages import ReportBatch, SnapshotBatch
from mesh.core.policy import Metric, RateKey
from mesh.telemetry import Telemetry

__all__ = ["DelayTimer", "DELAY_TRACK_MAX", "DELAYS_KEPT"]

DELAY_TRACK_MAX = 100_000  # keys whose report delay is being timed; cleared when full
DELAYS_KEPT = 512  # recent report delays, for d in the envelope estimate
TICK_LAGS_KEPT = 1024  # recent sync ticks' lateness (about 5 s at the default interval)
NS = 1_000_000_000


class DelayTimer:
    """Times our reports to their acknowledgements and snapshots to the next, per metric;
    the prometheus children are cached per metric."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.recent_delays_ns: deque[int] = deque(maxlen=DELAYS_KEPT)
        # How late each recent sync tick ran (ns, 0 when on time), for d as well.
        self.recent_tick_lags_ns: deque[int] = deque(maxlen=TICK_LAGS_KEPT)
        self._report_sent: dict[RateKey, tuple[int, int]] = {}  # key -> (sequence, sent ns)
        self._last_snapshot: dict[RateKey, int] = {}
        self._report_children: dict[str, Any] = {}
        self._snapshot_children: dict[str, Any] = {}
        # seed 004's names made now, not among the first keys' (they would pin memory)
        for metric in Metric:
            self._histogram(self._report_children, metric, True)
            self._histogram(self._snapshot_children, metric, False)

    def sent(self, now: int, batch: ReportBatch) -> None:
        """Our report batch went out at `now`: time each key's first report not yet timed."""
        sent = self._report_sent
        if len(sent) >= DELAY_TRACK_MAX:
            sent.clear()
        for key, seq in zip(batch.keys, batch.sequences, strict=True):
            if key not in sent:
                sent[key] = (seq, now)

    def observe(self, now: int, batch: SnapshotBatch) -> None:
        """Report delay (send to acknowledgement) and snapshot delay (age of the view
        when the next snapshot lands), per metric."""
        sent, last = self._report_sent, self._last_snapshot
        if len(last) >= DELAY_TRACK_MAX:
            last.clear()
        for key, ack in zip(batch.keys, batch.acks, strict=True):
            t = sent.get(key)
            if t is not None and ack >= t[0]:
                del sent[key]
                self.recent_delays_ns.append(now - t[1])
                self._histogram(self._report_children, key.metric, True).observe((now - t[1]) / NS)
            prev = last.get(key)
            if prev is not None:
                self._histogram(self._snapshot_children, key.metric, False).observe(
                    (now - prev) / NS
                )
            last[key] = now

    def forget_idle(self, old: int) -> None:
        """Drop the timings that began at or before `old`."""
        self._report_sent = {k: t for k, t in self._report_sent.items() if t[1] > old}
        self._last_snapshot = {k: t for k, t in self._last_snapshot.items() if t > old}

    def _histogram(self, cache: dict[str, Any], metric: str, report: bool) -> Any:
        child = cache.get(metric)
        if child is None:
            h = self.telemetry.report_delay if report else self.telemetry.snapshot_delay
            child = cache[metric] = h.labels(metric)
        return child

"""Units admitted per limit on this worker, counted off the hot path (docs/telemetry.md).

`try_admit` adds what it admits to its view's `pending` and does nothing else, so the node
counts the units where they leave `pending`, on its own loop:

* a `global` view (and a `strict` limit's mesh front, a global view too) turns `pending`
  into a usage report: `reported` counts each report once, the first time the node sees it
  go out (its sequence above the last one counted for that view), from its delta;
* a `local` or `share` view (and a `redis` limit with no tier, enforced here alone) charges
  `pending` to its meter at the tick's settle: `settling` reads what the views waiting to
  settle hold just before the tick, and the tick settles each of them.

The counts trail the admissions by one sync interval at most, and the node loop pays a
look at each report it sends and each local view it settles. A refund (bytes charged and
not sent) lowers a limit's net; what is exported is the highest net reached, so the counter
never goes down and `rate()` of it is the admitted rate net of refunds. A `redis` limit
answered by the shared counter is not counted here (Redis meters it), nor is a spend quota
(no rate) or a disabled limit (no limit).

Bounds: `_last_sequence` holds the global views counted since the last `forget_idle`,
pruned then to the views the reporter still has; `_limits` holds the limits that moved
since the previous `forget_idle` (an idle limit's net is dropped and its total kept in
`totals`, per (metric, mode): the exported sum over tenants never goes down).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mesh.core.admission import Admission
from mesh.core.gate import Gate
from mesh.core.messages import ReportBatch
from mesh.core.policy import RateKey
from mesh.core.reporter import GlobalGate

__all__ = ["AdmittedUnits", "Limit"]

Limit = tuple[str, str, str]  # the RateKey's tenant part, metric, mode


class AdmittedUnits:
    """Per limit (tenant part, metric, mode): the units admitted here, net of refunds."""

    def __init__(self) -> None:
        # limit -> [net, highest net]: the highest is what is exported (monotonic)
        self._limits: dict[Limit, list[int]] = {}
        self._seen: dict[Limit, int] = {}  # highest nets at the last forget_idle
        # (metric, mode) -> the sum of the highest nets of every limit ever counted, the
        # forgotten ones included
        self.totals: dict[tuple[str, str], int] = {}
        self._last_sequence: dict[GlobalGate, int] = {}  # view -> last report counted

    def add(self, gate: Gate, units: int) -> None:
        p = gate.policy
        k = (p.tenant_id, p.metric, p.mode.value)
        row = self._limits.get(k)
        if row is None:
            row = self._limits[k] = [0, 0]
        row[0] += units
        if row[0] > row[1]:
            s = (k[1], k[2])
            self.totals[s] = self.totals.get(s, 0) + row[0] - row[1]
            row[1] = row[0]

    def reported(self, gates: Mapping[RateKey, GlobalGate], batch: ReportBatch) -> None:
        """Count the reports of `batch` (ours, on its way out) not counted before. A view's
        sequences only grow, so a sequence above the last one counted is a report never
        counted; a resend repeats one at or below it."""
        last = self._last_sequence
        for key, seq, delta in zip(batch.keys, batch.sequences, batch.deltas, strict=True):
            v = gates.get(key)
            if v is None or seq <= last.get(v, 0):
                continue
            last[v] = seq
            self.add(v, delta // v.scale)  # deltas are in sub-units (`Gate`)

    @staticmethod
    def settling(admission: Admission) -> list[tuple[Gate, int]]:
        """What the local and share views waiting for the next tick's settle hold: the
        tick charges all of it (`LocalGate.settle`), so call it just before the tick,
        under the same hold of the node's lock, and hand the result to `settled`.
        Reads `Admission._settle`: the core keeps that set for this very tick."""
        return [(v, v.pending) for v in admission._settle if v.pending]

    def settled(self, held: Iterable[tuple[Gate, int]]) -> None:
        for v, units in held:
            self.add(v, units)

    def forget_idle(self, gates: Mapping[RateKey, GlobalGate]) -> None:
        """Drop the limits whose count did not move since the last call (their totals stay
        in `totals`), and the sequences of views the reporter no longer holds."""
        seen = self._seen
        for k in [k for k, row in self._limits.items() if seen.get(k) == row[1]]:
            del self._limits[k]
        self._seen = {k: row[1] for k, row in self._limits.items()}
        self._last_sequence = {
            v: s for v, s in self._last_sequence.items() if gates.get(v.key) is v
        }

    def by_limit(self) -> dict[Limit, int]:
        """Each limit counted since it was last idle: its highest net."""
        return {k: row[1] for k, row in self._limits.items()}

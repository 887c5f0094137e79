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

Bound: `_views` holds the views counted since the previous `forget_idle` (the node calls it
every `FORGET_IDLE_NS`); a view whose count did not move since is dropped, its count kept
in a total per (metric, mode), so the exported sum over tenants never goes down.
"""

from __future__ import annotations

from collections.abc import Mapping

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
        # view -> [net, highest net, last report sequence counted, a local view's charged
        # total counted]. Keyed by the view (an
        # identity hash): the counts run on the node loop once per settle or report, and
        # what they belong to is only looked up at a scrape (`by_limit`).
        self._views: dict[Gate, list[int]] = {}
        self._seen: dict[Gate, int] = {}  # highest nets at the last forget_idle
        # (metric, mode) -> the highest nets of the views forgotten since the start
        self._forgotten: dict[tuple[str, str], int] = {}

    def reported(self, gates: Mapping[RateKey, GlobalGate], batch: ReportBatch) -> None:
        """Count the reports of `batch` (ours, on its way out) not counted before. A view's
        sequences only grow, so a sequence above the last one counted is a report never
        counted; a resend repeats one at or below it."""
        views = self._views
        for key, seq, delta in zip(batch.keys, batch.sequences, batch.deltas, strict=True):
            v = gates.get(key)
            if v is None:
                continue
            row = views.get(v)
            if row is None:
                row = views[v] = [0, 0, 0, 0]
            elif seq <= row[2]:
                continue
            row[2] = seq
            row[0] += delta // v.scale  # deltas are in sub-units (`Gate`)
            if row[0] > row[1]:
                row[1] = row[0]

    def settling(self, admission: Admission) -> None:
        """Count what the local and share views waiting for the next tick's settle hold:
        the tick charges all of it (`LocalGate.settle` empties `pending`; a refund charges it
        at once, into `charged`). Call it just
        before the tick, under the same hold of the node's lock. Reads
        `Admission._settle`: the core keeps that set for this very tick."""
        views = self._views
        for v in admission._settle:
            # What it charged (net of refunds, which charge what is pending first) and what
            # the tick will charge: the part not counted yet.
            total = v.charged + v.pending
            row = views.get(v)
            if row is None:
                if not total:
                    continue
                row = views[v] = [0, 0, 0, 0]
            units = total - row[3]
            if units:
                row[3] = total
                row[0] += units
                if row[0] > row[1]:
                    row[1] = row[0]

    def forget_idle(self) -> None:
        """Drop the views whose count did not move since the last call (the core forgets
        idle views too): their counts stay in the totals."""
        seen, gone, views = self._seen, self._forgotten, self._views
        for v in [v for v, row in views.items() if seen.get(v) == row[1]]:
            p = v.policy
            s = (p.metric, p.mode.value)
            gone[s] = gone.get(s, 0) + views.pop(v)[1]
        self._seen = {v: row[1] for v, row in views.items()}

    def by_limit(self) -> dict[Limit, int]:
        """Each limit's count since it was last idle: the highest nets of its views (its
        generations, a view forgotten and opened again), summed."""
        out: dict[Limit, int] = {}
        for v, row in self._views.items():
            p = v.policy
            k = (p.tenant_id, p.metric, p.mode.value)
            out[k] = out.get(k, 0) + row[1]
        return out

    def totals(self) -> dict[tuple[str, str], int]:
        """Per (metric, mode), every limit ever counted, the forgotten ones included:
        never goes down."""
        out = dict(self._forgotten)
        for v, row in self._views.items():
            s = (v.policy.metric, v.policy.mode.value)
            out[s] = out.get(s, 0) + row[1]
        return out

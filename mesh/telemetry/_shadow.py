"""Shadow posture in /metrics and /health (docs/policies.md, "Shadow posture").

`ratemesh_shadow_would_deny` and `ratemesh_shadow_would_deny_units` count the calls (and
units) that limits in shadow posture admitted and would have denied, per tenant, metric and
the reason enforcing would have given: the core's counts (`WouldDeny`), read at scrape.
Tenant labels are the same top-K as every other family's; the rest, and tenants whose
views were forgotten idle, are summed under "other", and summed over labels a counter never
decreases (`_Labelled`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, Metric

from mesh.core.admission import WouldDeny

__all__ = ["ShadowTelemetry", "SHADOW_HEALTH_ROWS_MAX"]

# Tenants /health lists by name under `shadow.would_deny` (the most would-denies first).
SHADOW_HEALTH_ROWS_MAX = 50

_Series = tuple[str, str]  # metric, reason


class Labelled(Protocol):
    """Counters by (tenant label, series) kept monotonic while the top-K changes
    (`mesh.telemetry._metrics._Labelled`)."""

    def update(
        self,
        top: set[str],
        per_tenant: dict[tuple[str, _Series], int],
        totals: dict[_Series, int],
    ) -> list[tuple[str, _Series, int]]: ...


class ShadowTelemetry:
    """The would-deny families of one node; `source` is its admission's counts (set when
    the node starts; None: nothing to export yet). `labelled` makes the monotonic
    top-K counters and `label` writes a tenant as a label value, as every family does."""

    def __init__(self, labelled: Callable[[], Labelled], label: Callable[[str], str]) -> None:
        self.source: WouldDeny | None = None
        self.label = label
        self._calls = labelled()
        self._units = labelled()

    def families(self, top: set[str]) -> Iterator[Metric]:
        """The two counters for the tenants in `top` (the scrape's labelled set)."""
        src = self.source
        calls: dict[tuple[str, _Series], int] = {}
        units: dict[tuple[str, _Series], int] = {}
        totals_c: dict[_Series, int] = {}
        totals_u: dict[_Series, int] = {}
        if src is not None:
            for (tenant, metric), rows in list(src.per_tenant.items()):
                for reason, (c, u) in list(rows.items()):
                    calls[(tenant, (metric, str(reason)))] = c
                    units[(tenant, (metric, str(reason)))] = u
            for (metric, reason), (c, u) in list(src.totals.items()):
                totals_c[(metric, str(reason))], totals_u[(metric, str(reason))] = c, u
        lab = ["tenant", "metric", "reason"]
        for name, help_, labelled, per, totals in (
            (
                "ratemesh_shadow_would_deny",
                "Calls that limits in shadow posture admitted and would have denied, by "
                "the reason enforcing would have given",
                self._calls,
                calls,
                totals_c,
            ),
            (
                "ratemesh_shadow_would_deny_units",
                "Units (or bytes) of those calls",
                self._units,
                units,
                totals_u,
            ),
        ):
            fam = CounterMetricFamily(name, help_, labels=lab)
            for t, (m, r), n in sorted(labelled.update(top, per, totals)):
                fam.add_metric([self.label(t), m, r], n)
            yield fam

    def health(self, src: WouldDeny) -> dict[str, Any]:
        """/health's `shadow`: would-denies counted here ever (`total`), and per tenant
        since its view was last idle, the most first (at most SHADOW_HEALTH_ROWS_MAX)."""
        rows = src.rows()
        rows.sort(key=lambda r: (-r[3], r[0], r[1], r[2]))
        total = src.total()
        return {
            "would_deny": [
                {"tenant": self.label(t), "metric": m, "reason": r, "calls": c, "units": u}
                for t, m, r, c, u in rows[:SHADOW_HEALTH_ROWS_MAX]
            ],
            "would_deny_omitted": max(0, len(rows) - SHADOW_HEALTH_ROWS_MAX),
            "total": {"calls": total.calls, "units": total.units},
        }

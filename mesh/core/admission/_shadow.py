"""What limits in shadow posture would have denied (docs/policies.md, "Shadow posture").

A shadow view is the enforcing view itself: it meters, settles, reports and denies exactly
as it would if enforcing, so its bucket is charged only with what it would have admitted.
Only the answer differs (`mesh.core.verdict.shadowed`): every call is admitted, and a call
the view denied is counted here, per (tenant, metric, reason), in calls and in units. So
what a shadow limit counts is what its enforcing twin would deny on the same traffic.

The counts per tenant are bounded (`SHADOW_KEYS_MAX`; past it a new tenant counts under
`OTHER`) and shrink with the views: a view the idle sweep forgets folds its counts into the
per-(metric, reason) totals, which never go down.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["OTHER", "SHADOW_KEYS_MAX", "WouldDeny", "WouldDenyCount"]

# (tenant, metric, reason) entries counted per tenant at once; past it a new tenant's
# would-denies count under OTHER (the totals stay exact).
SHADOW_KEYS_MAX = 4096
OTHER = "other"  # the tenant part of the entries past the bound (telemetry's label too)


class WouldDenyCount(NamedTuple):
    calls: int
    units: int


class WouldDeny:
    """Would-deny counts of one worker's shadow limits (module docstring)."""

    def __init__(self, keys_max: int = SHADOW_KEYS_MAX) -> None:
        self.keys_max = keys_max
        # (tenant, metric) -> reason -> [calls, units], since the tenant's view was last idle
        self.per_tenant: dict[tuple[str, str], dict[str, list[int]]] = {}
        # (metric, reason) -> [calls, units], ever (forgotten views included)
        self.totals: dict[tuple[str, str], list[int]] = {}

    def add(self, tenant: str, metric: str, reason: str, units: int) -> None:
        """Count one call of `units` the limit would have denied for `reason`."""
        k = (tenant, metric)
        rows = self.per_tenant.get(k)
        if rows is None:
            if len(self.per_tenant) >= self.keys_max:
                k = (OTHER, metric)
            rows = self.per_tenant.setdefault(k, {})
        row = rows.get(reason)
        if row is None:
            row = rows[reason] = [0, 0]
        row[0] += 1
        row[1] += units
        total = self.totals.get((metric, reason))
        if total is None:
            total = self.totals[(metric, reason)] = [0, 0]
        total[0] += 1
        total[1] += units

    def forget(self, tenant: str, metric: str) -> None:
        """`tenant`'s view of `metric` was forgotten idle: its counts live on in the totals."""
        self.per_tenant.pop((tenant, metric), None)

    def of(self, tenant: str, metric: str) -> WouldDenyCount:
        """`tenant`'s would-denies on `metric` since its view was last idle, all reasons."""
        rows = self.per_tenant.get((tenant, metric), {})
        return WouldDenyCount(sum(c for c, _ in rows.values()), sum(u for _, u in rows.values()))

    def rows(self) -> list[tuple[str, str, str, int, int]]:
        """(tenant, metric, reason, calls, units) per tenant, sorted."""
        return sorted(
            (t, m, str(r), c, u)  # a Reason given to `add` is a str; str() is its value
            for (t, m), rows in self.per_tenant.items()
            for r, (c, u) in rows.items()
        )

    def total(self) -> WouldDenyCount:
        """Every would-deny this worker counted, ever."""
        return WouldDenyCount(
            sum(c for c, _ in self.totals.values()), sum(u for _, u in self.totals.values())
        )

"""What this member's limits took from its traffic, per tenant: the `meters` of /health
and of the Status answer, which `mesh policy preview` samples across the fleet twice, a
window apart, to see each tenant's current traffic (docs/operations-policy.md).

Per (tenant, metric): the units admitted here (the node's AdmittedUnits: net of refunds,
counted as views settle or report) and the calls admitted and denied here (the decision
counts). Each runs since the limit was last idle here, so a sampler takes the difference of
two readings and reads a fall as a restart from 0.
"""

from __future__ import annotations

from typing import Any

from mesh.node._driver import NodeDriver
from mesh.telemetry._metrics import _label

__all__ = ["METERS_SHOWN_MAX", "meters"]

# Rows in one answer (the most admitted units first); past it they are counted in
# `meters_omitted`, as `policies.enforced` is bounded. About 100 bytes a row: with the rest
# of a Status answer it stays well inside one peer message (MAX_MESSAGE_BYTES, 4 MiB).
METERS_SHOWN_MAX = 4096


def meters(driver: NodeDriver) -> tuple[list[dict[str, Any]], int]:
    """The rows (tenant label, metric, admitted_units, admitted_calls, denied_calls), and
    how many were left out past METERS_SHOWN_MAX."""
    with driver.lock:
        units = driver.units.by_limit()
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for (tenant, metric, _mode), n in units.items():
        row = _row(rows, _label(tenant), metric)
        row["admitted_units"] += n
    for (label, metric), counts in driver.telemetry.limit_numbers().items():
        row = _row(rows, label, metric)
        row["admitted_calls"] += int(counts.get("admitted", 0))
        row["denied_calls"] += int(counts.get("denied", 0))
    ordered = sorted(rows.values(), key=lambda r: (-r["admitted_units"], r["tenant"], r["metric"]))
    return ordered[:METERS_SHOWN_MAX], max(0, len(ordered) - METERS_SHOWN_MAX)


def _row(rows: dict[tuple[str, str], dict[str, Any]], tenant: str, metric: str) -> dict[str, Any]:
    row = rows.get((tenant, metric))
    if row is None:
        row = rows[(tenant, metric)] = {
            "tenant": tenant,
            "metric": metric,
            "admitted_units": 0,
            "admitted_calls": 0,
            "denied_calls": 0,
        }
    return row

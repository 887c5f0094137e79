"""SRE telemetry for a mesh node: Prometheus metrics, the excess envelope, /health JSON
(the pages as route functions; the sidecar's HTTP server serves them).

Labels are tenant, metric, mode and reason only: never a key generation or another
worker's id (this process is the worker; its id is a target label, set by the scraper).
Tenant label values are the top-K tenants (node config `telemetry_top_k`) and "other".
"""

from mesh.telemetry._envelope import excess_over_times, excess_over_windows
from mesh.telemetry._fleet import (
    ENFORCED_ROWS_MAX,
    Enforced,
    MemberAnswer,
    enforced_of,
    fleet_report,
    fleet_table,
)
from mesh.telemetry._metrics import (
    DECISIONS_IDLE_S,
    OTHER,
    TOP_K,
    NodeStats,
    Telemetry,
    rate_and_burst,
)
from mesh.telemetry._routes import PUBLIC_HEALTH_KEYS, Detail, Route, telemetry_routes

__all__ = [
    "DECISIONS_IDLE_S",
    "Detail",
    "ENFORCED_ROWS_MAX",
    "Enforced",
    "MemberAnswer",
    "enforced_of",
    "fleet_report",
    "fleet_table",
    "NodeStats",
    "OTHER",
    "PUBLIC_HEALTH_KEYS",
    "Route",
    "TOP_K",
    "Telemetry",
    "excess_over_times",
    "excess_over_windows",
    "rate_and_burst",
    "telemetry_routes",
]

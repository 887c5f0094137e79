"""SRE telemetry for a mesh node: Prometheus metrics, the excess envelope, /health JSON.

Labels are tenant, metric, mode and reason only: never a key generation or another
worker's id (this process is the worker; its id is a target label, set by the scraper).
Tenant label values are the top-K tenants (node config `telemetry_top_k`) and "other".
"""

from mesh.telemetry._envelope import excess_over_times, excess_over_windows
from mesh.telemetry._http import HttpEndpoint
from mesh.telemetry._metrics import DECISIONS_IDLE_S, OTHER, TOP_K, NodeStats, Telemetry

__all__ = [
    "DECISIONS_IDLE_S",
    "HttpEndpoint",
    "NodeStats",
    "OTHER",
    "TOP_K",
    "Telemetry",
    "excess_over_times",
    "excess_over_windows",
]

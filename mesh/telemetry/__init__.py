"""SRE telemetry for a mesh node: Prometheus metrics, the excess envelope, /health JSON.

Labels are tenant, metric, mode and reason only: never a key generation or another
worker's id (this process is the worker; its id is a target label, set by the scraper).
"""

from mesh.telemetry._envelope import excess_over_windows
from mesh.telemetry._http import HttpEndpoint
from mesh.telemetry._metrics import TENANTS_MAX, NodeStats, Telemetry

__all__ = ["HttpEndpoint", "NodeStats", "TENANTS_MAX", "Telemetry", "excess_over_windows"]

"""The node's read-only HTTP pages, as route functions: served by the sidecar's HTTP server
(uvicorn, `mesh.sidecar`), which serves them on `telemetry_listen` and the sidecar's
`http_listen` alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mesh.telemetry._metrics import Telemetry

__all__ = ["Route", "telemetry_routes"]

Route = Callable[[], tuple[int, str, bytes]]  # () -> (status, content type, body)


def telemetry_routes(tel: Telemetry, health: Callable[[], dict[str, Any]]) -> dict[str, Route]:
    """GET /metrics (Prometheus text) and GET /health (JSON)."""
    return {
        "/metrics": lambda: (200, "text/plain; version=0.0.4", tel.render()),
        "/health": lambda: (
            200,
            "application/json",
            json.dumps(health(), sort_keys=True).encode(),
        ),
    }

"""The node's read-only HTTP pages, as route functions: served by the sidecar's HTTP server
(uvicorn, `mesh.sidecar`), which serves them on `telemetry_listen` and the sidecar's
`http_listen` alike.

/health carries, per limit, this member's decisions and its excess estimate beside the
bound (`Telemetry.limit_numbers`), so the /ui page (ratemesh/ui.py) reads one JSON document."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mesh.telemetry._metrics import Telemetry
from ratemesh.ui import node_page

__all__ = ["Route", "telemetry_routes"]

Route = Callable[[], tuple[int, str, bytes]]  # () -> (status, content type, body)


def telemetry_routes(tel: Telemetry, health: Callable[[], dict[str, Any]]) -> dict[str, Route]:
    """GET /metrics (Prometheus text), GET /health (JSON) and GET /ui (the live page)."""

    def health_json() -> tuple[int, str, bytes]:
        """200 while serving; 503 once the node is closing (a graceful leave hands its keys
        over), so a readiness probe takes it out of rotation before it stops."""
        h = health()
        code = 503 if h.get("status") == "closing" else 200
        return code, "application/json", json.dumps(with_numbers(tel, h), sort_keys=True).encode()

    page = node_page()
    return {
        "/metrics": lambda: (200, "text/plain; version=0.0.4", tel.render()),
        "/health": health_json,
        "/ui": lambda: (200, "text/html; charset=utf-8", page),
    }


def with_numbers(tel: Telemetry, h: dict[str, Any]) -> dict[str, Any]:
    """Each limit of `h` with `admitted`, `denied`, `excess_estimate` and `excess_bound`
    where telemetry has them (matched by the tenant as /metrics labels it; a default "*"
    policy's row has none: its tenants are counted under their own names)."""
    numbers = tel.limit_numbers()
    for entry in h.get("limits", []):
        label = entry["tenant"]
        if entry.get("descriptor"):
            label += f"[{entry['descriptor']}]"
        entry.update(numbers.get((label, entry["metric"]), {}))
    return h

"""The node's read-only HTTP pages, as route functions: served by the sidecar's HTTP server
(uvicorn, `mesh.sidecar`), which serves them on `telemetry_listen` and the sidecar's
`http_listen` alike.

/health carries, per limit, this member's decisions and its excess estimate beside the
bound (`Telemetry.limit_numbers`), so the /ui page (ratemesh/ui.py) reads one JSON document.

That detail names every tenant, so it is for loopback callers and holders of the operator
token (docs/security.md): each of those pages is a `Detail` whose `public` form is what
anyone else gets: /health with the status and no tenant, member or policy in it (a probe
needs no more), /metrics without its tenant-labelled series, and no /ui (401)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mesh.core.policy import DEFAULT_TENANT
from mesh.telemetry._metrics import Telemetry
from ratemesh.policy import DESCRIPTOR_SEP
from ratemesh.ui import node_page

__all__ = ["PUBLIC_HEALTH_KEYS", "SERVED_SHOWN_MAX", "Detail", "Route", "telemetry_routes"]

Route = Callable[[], tuple[int, str, bytes]]  # () -> (status, content type, body)


@dataclass(frozen=True, slots=True)
class Detail:
    """A page that names tenants: `full` for loopback callers and the operator token,
    `public` for anyone else (None: 401)."""

    full: Route
    public: Route | None

    def __call__(self) -> tuple[int, str, bytes]:
        return self.full()


# what /health says to anyone: serving or closing, and whose answer it is
PUBLIC_HEALTH_KEYS = ("member_id", "status", "worker_epoch")


def telemetry_routes(tel: Telemetry, health: Callable[[], dict[str, Any]]) -> dict[str, Route]:
    """GET /metrics (Prometheus text), GET /health (JSON) and GET /ui (the live page)."""

    def health_json() -> tuple[int, str, bytes]:
        """200 while serving; 503 once the node is closing (a graceful leave hands its keys
        over), so a readiness probe takes it out of rotation before it stops."""
        h = health()
        code = 503 if h.get("status") == "closing" else 200
        return code, "application/json", json.dumps(with_numbers(tel, h), sort_keys=True).encode()

    page = node_page()
    public = _public_routes(tel, health)
    return {
        "/metrics": Detail(
            lambda: (200, "text/plain; version=0.0.4", tel.render()), public["/metrics"]
        ),
        "/health": Detail(health_json, public["/health"]),
        "/ui": Detail(lambda: (200, "text/html; charset=utf-8", page), None),
    }


def _public_routes(tel: Telemetry, health: Callable[[], dict[str, Any]]) -> dict[str, Route]:
    """The forms of the detail pages for a caller who may not read per-tenant detail."""

    def health_json() -> tuple[int, str, bytes]:
        h = health()
        code = 503 if h.get("status") == "closing" else 200
        doc = {k: h[k] for k in PUBLIC_HEALTH_KEYS if k in h}
        doc["detail"] = "from loopback, or with authorization: Bearer <operator token>"
        return code, "application/json", json.dumps(doc, sort_keys=True).encode()

    return {
        "/metrics": lambda: (200, "text/plain; version=0.0.4", tel.render_public()),
        "/health": health_json,
    }


SERVED_SHOWN_MAX = 200  # tenants listed under `served`; the rest are counted


def with_numbers(tel: Telemetry, h: dict[str, Any]) -> dict[str, Any]:
    """Each limit of `h` with `admitted`, `denied`, `excess_estimate` and `excess_bound`
    where telemetry has them (matched by the tenant as /metrics labels it; a default "*"
    policy's row has none: its tenants are counted under their own names, in `served`)."""
    numbers = tel.limit_numbers()
    named: set[tuple[str, str]] = set()
    for entry in h.get("limits", []):
        label = entry["tenant"]
        if entry.get("descriptor"):
            label += f"[{entry['descriptor']}]"
        named.add((label, entry["metric"]))
        entry.update(numbers.get((label, entry["metric"]), {}))
    if "limits" in h:
        rows = [(k, v) for k, v in numbers.items() if k not in named]
        h["served"], h["served_omitted"] = _served(tel, rows)
    return h


def _served(
    tel: Telemetry, rows: list[tuple[tuple[str, str], dict[str, float]]]
) -> tuple[list[dict[str, Any]], int]:
    """The tenants this member decided for under a default policy ("*", or a descriptor's
    default) rather than one by name, busiest (most denied, then admitted) first, at most
    `SERVED_SHOWN_MAX`; and how many more there were."""
    rows.sort(key=lambda r: (-r[1].get("denied", 0), -r[1].get("admitted", 0), r[0]))
    out: list[dict[str, Any]] = []
    more = 0
    for (label, metric), n in rows:
        base, sep, desc = label.partition("[")
        tenant = f"{base}{DESCRIPTOR_SEP}{desc[:-1]}" if sep else label
        p = tel.policy_for(tenant, metric)
        if p is None:  # no policy at all (policy_unknown): not served
            continue
        if len(out) == SERVED_SHOWN_MAX:
            more += 1
            continue
        # the scope of the default that applies: "*", or a descriptor's default
        scope = DEFAULT_TENANT if not sep else "descriptor default"
        out.append({"tenant": label, "metric": metric, "policy": scope, "mode": p.mode.value, **n})
    return out, more

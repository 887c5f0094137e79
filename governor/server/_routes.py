"""governord's HTTP pages: the one table of path -> page (``routes``), served by ``_http``.

A page is an async function of nothing that returns a ``Reply``; what a page reads comes from
the ``Site`` it closes over. A new page is one line in ``routes``. A path not in the table is
404, so a probe or a scrape aimed at the wrong path fails loudly instead of reading metrics.

Per-tenant detail (the live page and its JSON, /metrics' tenant series) is a ``Guarded``
page: served whole on loopback or to a caller with a pages token (``pages.token_file`` /
``pages.token_env``), else in its public form (/metrics without tenant series) or 401.
Liveness and readiness carry no tenant data at all (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from governor.authority import Authority
from governor.config import GovernordConfig

from ._health import Health
from ._metrics import Metrics
from ._ui import Route, ui_routes

__all__ = ["JSON", "Guarded", "Page", "Reply", "Site", "json_reply", "routes"]

JSON = "application/json"


class Reply(NamedTuple):
    status: int
    content_type: str
    body: bytes


Page = Callable[[], Awaitable[Reply]]


@dataclass(frozen=True, slots=True)
class Guarded:
    """A page that shows every tenant: whole for loopback or a pages-token holder, else
    ``public`` (None: 401)."""

    page: Page
    public: Page | None
    tokens: tuple[bytes, ...]

    async def __call__(self) -> Reply:
        return await self.page()


@dataclass(frozen=True, slots=True)
class Site:
    """What governord's pages read (``authority`` is None on a standby: no engine, no UI)."""

    authority: Authority | None
    config: GovernordConfig
    metrics: Metrics
    health: Health


def json_reply(status: int, doc: Any) -> Reply:
    return Reply(status, JSON, json.dumps(doc, sort_keys=True).encode() + b"\n")


async def metrics_page(site: Site, *, public: bool = False) -> Reply:
    """Prometheus text; rendered in a thread, as the tree is read under the engine's lock.
    ``public``: without the series labelled by tenant."""
    registry = site.metrics.public if public else site.metrics.registry
    body = await asyncio.to_thread(generate_latest, registry)
    return Reply(200, CONTENT_TYPE_LATEST, body)


async def health_page(site: Site) -> Reply:
    """The whole report; 200 when ready, 503 otherwise."""
    report = await site.health.report()
    return json_reply(200 if report["ready"] else 503, report)


async def live_page(site: Site) -> Reply:
    report = await site.health.report()
    return json_reply(200 if report["live"] else 503, _one(report, "live"))


async def ready_page(site: Site) -> Reply:
    report = await site.health.report()
    return json_reply(200 if report["ready"] else 503, _one(report, "ready"))


def _one(report: dict[str, Any], question: str) -> dict[str, Any]:
    return {question: report[question], "status": report["status"], "checks": report["checks"]}


def routes(site: Site) -> dict[str, Page]:
    """GET (and HEAD) paths governord answers; anything else is 404."""
    tokens = site.config.pages_tokens
    return {
        "/metrics": Guarded(
            lambda: metrics_page(site), lambda: metrics_page(site, public=True), tokens
        ),
        "/health": lambda: health_page(site),
        "/health/live": lambda: live_page(site),
        "/health/ready": lambda: ready_page(site),
        **(
            {
                path: Guarded(_threaded(route), None, tokens)
                for path, route in ui_routes(site.authority).items()
            }
            if site.authority is not None
            else {}
        ),
    }


def _threaded(route: Route) -> Page:
    """A page that reads under the engine's lock, run off the event loop."""

    async def page() -> Reply:
        return Reply(*await asyncio.to_thread(route))

    return page

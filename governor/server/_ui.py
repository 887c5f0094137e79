"""governord's live page: `GET /ui` (ratemesh/ui.py) and the JSON it polls, `GET /ui/status`:
the tree (root, tenants, their tasks, at most `TREE_SHOWN_MAX` nodes, breadth first) with
used against cap, leases held against limit, and each rated node's credit level and the
credit outstanding in workers' hands. Read once per request under the engine's lock, like
a scrape (governor/server/_metrics.py)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from governor.authority import Authority
from governor.engine import ROOT_ID, Engine, NodeState, SessionState
from ratemesh.ui import governord_page

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["TREE_SHOWN_MAX", "serve_metrics_and_ui", "tree_status", "ui_routes", "with_routes"]

TREE_SHOWN_MAX = 500  # nodes listed on /ui/status; the rest are counted in nodes_omitted

Route = Callable[[], tuple[int, str, bytes]]  # () -> (status, content type, body)


def tree_status(engine: Engine) -> dict[str, Any]:
    st = engine.state
    tree: list[dict[str, Any]] = []
    active = [n for n in st.nodes.values() if n.state is NodeState.ACTIVE]
    todo = [(ROOT_ID, "")]
    while todo and len(tree) < TREE_SHOWN_MAX:
        nid, parent_path = todo.pop(0)
        n = st.nodes[nid]
        path = f"{parent_path}/{n.name}" if parent_path else n.name
        credit: dict[str, dict[str, int]] = {}
        for res in sorted(r for (cid, r) in st.credit.buckets if cid == nid):
            view = engine.credit_level(nid, res)
            if view is not None:
                level, out, rate = view
                credit[res] = {
                    "level": level,
                    "outstanding": out,
                    "per_s": rate.per_s,
                    "burst": rate.burst,
                }
        tree.append(
            {
                "id": nid,
                "name": n.name,
                "path": path,
                "depth": n.depth,
                "quotas": dict(sorted(n.quotas.items())),
                "used": dict(sorted(n.used.items())),
                "limits": dict(sorted(n.limits.items())),
                "held": dict(sorted(n.held.items())),
                "credit": credit,
            }
        )
        kids = sorted(c for c in n.children if st.nodes[c].state is NodeState.ACTIVE)
        todo.extend((c, path) for c in kids)
    return {
        "tree": tree,
        "nodes": len(active),
        "nodes_omitted": len(active) - len(tree),
        "sessions": sum(1 for s in st.sessions.values() if s.state is SessionState.OPEN),
        "queued": len(list(engine.queued())),
    }


def ui_routes(authority: Authority) -> dict[str, Route]:
    page = governord_page()

    def status() -> tuple[int, str, bytes]:
        doc = authority.read(tree_status)
        return 200, "application/json", json.dumps(doc, sort_keys=True).encode()

    return {"/ui": lambda: (200, "text/html; charset=utf-8", page), "/ui/status": status}


def with_routes(app: WSGIApplication, routes: dict[str, Route]) -> WSGIApplication:
    """A WSGI app answering `routes` (GET) and handing every other path to `app`: how the
    /ui routes join the metrics server's."""

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        route = routes.get(environ.get("PATH_INFO", ""))
        if route is None or environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return app(environ, start_response)
        code, ctype, body = route()
        headers = [("Content-Type", ctype), ("Content-Length", str(len(body)))]
        start_response(f"{code} {HTTPStatus(code).phrase}", headers)
        return [body]

    return serve


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """No access log on stderr (governord's log is its own lines)."""


def serve_metrics_and_ui(
    host: str, port: int, registry: CollectorRegistry, authority: Authority
) -> None:
    """Serve /metrics (and, as prometheus_client's server does, every other path) plus
    /ui and /ui/status, on a daemon thread. An address that cannot be bound raises OSError."""
    server_cls: type[_Server] = _Server
    if ":" in host:
        server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
    app = with_routes(make_wsgi_app(registry), ui_routes(authority))
    httpd = make_server(host, port, app, server_cls, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="governord-metrics", daemon=True).start()

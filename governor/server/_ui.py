"""governord's live page: `GET /ui` (ratemesh/ui.py) and the JSON it polls, `GET /ui/status`:
the tree (root, tenants, their tasks, at most `TREE_SHOWN_MAX` nodes, breadth first) with
used against cap, leases held against limit, and each rated node's credit level and the
credit outstanding in workers' hands; and the mesh policies it serves (at most
`POLICIES_SHOWN_MAX`). The page reads its role, leader and store health from `/health`.
Read once per request under the engine's lock, like a scrape (governor/server/_metrics.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from governor.authority import Authority
from governor.engine import ROOT_ID, Engine, NodeState, SessionState
from ratemesh.ui import governord_page

if TYPE_CHECKING:
    pass

__all__ = ["POLICIES_SHOWN_MAX", "TREE_SHOWN_MAX", "tree_status", "ui_routes"]

TREE_SHOWN_MAX = 500  # nodes listed on /ui/status; the rest are counted in nodes_omitted
POLICIES_SHOWN_MAX = 500  # mesh policies listed on /ui/status; the rest are counted

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
    served = st.policies.current()
    return {
        "tree": tree,
        # the mesh's policies this governord serves to the nodes (as its coordinator)
        "policies": {
            "revision": st.policies.revision,
            "count": len(served),
            "served": [p.to_dict() for p in served[:POLICIES_SHOWN_MAX]],
            "omitted": max(0, len(served) - POLICIES_SHOWN_MAX),
        },
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

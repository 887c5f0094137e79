"""Histories from the real engine: one call of ``governor.engine.Engine`` as a history outcome
(the same vocabulary the server and the SDK give a recorder), and the tree an engine holds.

Tests run the engine sequentially and give each call an interval around the instant it ran,
so the true order is a linearization and the checker must agree (model = engine); two
engines standing in for a deposed and a new leader give the histories a fault makes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from governor.engine import (
    BlockEnd,
    Consumed,
    CreditGrant,
    CreditReturn,
    Denial,
    Engine,
    GovernorError,
    Granted,
    LeaseEnd,
    LeaseStatus,
    NotFound,
    Released,
)

from ._history import Outcome, Tree, TreeNode

__all__ = ["engine_call", "tree_of"]

Answer = tuple[Outcome, dict[str, Any], str]


def _denied(result: Denial) -> Answer:
    return "fail", {}, result.reason.value


def engine_call(engine: Engine, session_id: int, call: str, args: Mapping[str, Any]) -> Answer:
    """Run one call on ``engine`` for ``session_id``: (outcome, result, error).

    Acquire does not wait (``wait=False``: a full limit is a ``concurrency`` denial); a
    caller error is a ``fail`` named by its class (``not_found``, ``not_owner``, ...)."""
    a = args
    try:
        if call == "acquire":
            got = engine.acquire(session_id, a["node_id"], a["cls"], wait=False)
            if isinstance(got, Granted):
                return "ok", {"lease_id": got.lease_id}, ""
            assert isinstance(got, Denial)
            return _denied(got)
        if call == "release":
            rel = engine.release(session_id, a["lease_id"])
            assert isinstance(rel, Released)
            if not rel.by_this_call and rel.end is not LeaseEnd.RELEASED:
                return "fail", {}, "lease_ended"
            return "ok", {"released": rel.by_this_call}, ""
        if call == "validate":
            status = engine.validate(a["lease_id"])
            assert isinstance(status, LeaseStatus)
            return "ok", {"live": status.live}, ""
        if call == "consume":
            done = engine.consume(session_id, a["node_id"], a["resource"], a["amount"])
            if isinstance(done, Consumed):
                return "ok", {}, ""
            return _denied(done)
        if call == "reserve_credit":
            block = engine.reserve_credit(session_id, a["node_id"], a["resource"], a["units"])
            if isinstance(block, CreditGrant):
                res = {"block_id": block.block_id, "units": block.units, "ttl_ms": block.ttl_ms}
                return "ok", res, ""
            return _denied(block)
        if call == "return_credit":
            back = engine.return_credit(session_id, a["block_id"], a["unused"])
            assert isinstance(back, CreditReturn)
            assert back.applied or back.end in (BlockEnd.RETURNED, BlockEnd.EXPIRED)
            return "ok", {"returned": back.applied}, ""
    except NotFound:
        return "fail", {}, "not_found"
    except GovernorError as exc:
        return "fail", {}, _snake(type(exc).__name__)
    raise ValueError(f"call: unknown call {call!r}")


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


def tree_of(engine: Engine) -> Tree:
    """The engine's tree as the model reads it: caps, limits, bursts, and the counters now."""
    st = engine.state
    bursts: dict[int, dict[str, int]] = {}
    for (node_id, resource), bucket in sorted(st.credit.buckets.items()):
        bursts.setdefault(node_id, {})[resource] = bucket.rate.burst
    nodes = {
        n.id: TreeNode(
            n.id,
            n.parent,
            dict(n.quotas),
            dict(n.limits),
            bursts.get(n.id, {}),
            {r: u for r, u in n.used.items() if r in n.quotas},
            {c: h for c, h in n.held.items() if c in n.limits and h},
        )
        for n in st.nodes.values()
    }
    return Tree(nodes)

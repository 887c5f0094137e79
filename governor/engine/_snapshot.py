"""Snapshot: the whole durable state as JSON-able data, and back.

The snapshot is taken under the engine's lock. Loading one builds a ``State`` that the recorded
events after it are then applied to through ``State.apply``, the same path live calls use.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ._codec import decode_value, encode_value
from ._creditbook import dump_credit, load_credit
from ._errors import SnapshotMismatch
from ._policybook import PolicyBook
from ._state import ROOT_ID, AdaptiveState, Lease, Node, Session, State, Tombstone
from ._types import (
    AdaptiveConfig,
    Consumed,
    Created,
    CreditGrant,
    CreditReturn,
    Defaults,
    Edited,
    EngineConfig,
    Granted,
    LeaseEnd,
    NodeState,
    Released,
    SessionState,
)

__all__ = ["FORMAT", "dump_state", "load_state"]

FORMAT = "governor-snapshot/1"
_RESULTS: dict[str, type[Any]] = {
    c.__name__: c for c in (Consumed, Created, Edited, Granted, Released)
}
_RESULTS.update({c.__name__: c for c in (CreditGrant, CreditReturn)})


def _ints(d: dict[str, int]) -> dict[str, int]:
    return {k: d[k] for k in sorted(d)}


def dump_state(state: State) -> dict[str, Any]:
    nodes = []
    for nid in sorted(state.nodes):
        n = state.nodes[nid]
        nodes.append(
            {
                "id": n.id,
                "parent": n.parent,
                "name": n.name,
                "quotas": _ints(n.quotas),
                "limits": _ints(n.limits),
                "weight": n.weight,
                "priority": n.priority,
                "deadline_ms": n.deadline_ms,
                "defaults": encode_value(Defaults | None, n.defaults),
                "state": n.state.value,
                "ended_ms": n.ended_ms,
                "used": _ints(n.used),
                "direct": _ints(n.direct),
                "absorbed": _ints(n.absorbed),
                "cooldowns": _ints(n.cooldowns),
            }
        )
    sessions = []
    for sid in sorted(state.sessions):
        s = state.sessions[sid]
        sessions.append(
            {
                "id": s.id,
                "scope_id": s.scope_id,
                "ttl_ms": s.ttl_ms,
                "token_sha256": s.token_sha256,
                "expires_ms": s.expires_ms,
                "state": s.state.value,
                "ended_ms": s.ended_ms,
                **({} if s.key_sha256 is None else {"key_sha256": s.key_sha256}),
                "memory": [
                    [rid, fp, type(r).__name__, encode_value(type(r), r)]
                    for rid, (fp, r) in s.memory.items()
                ],
            }
        )
    return {
        "format": FORMAT,
        "seq": state.seq,
        "next_id": state.next_id,
        "next_node_id": state.next_node_id,
        "nodes": nodes,
        "sessions": sessions,
        "leases": [_lease(state.leases[i]) for i in sorted(state.leases)],
        "credit": dump_credit(state.credit),
        "tombstones": [
            [_lease(t.lease), t.end.value, t.ended_ms] for _, t in sorted(state.tombstones.items())
        ],
        "adaptive": [
            [
                cls,
                encode_value(AdaptiveConfig, a.config),
                a.last_adjust_ms,
                [list(x) for x in a.samples],
                a.ok_ms,
                a.busy_ms,
                a.busy_since_ms,
            ]
            for cls, a in sorted(state.adaptive.items())
        ],
        "policies": state.policies.dump(),
    }


def _lease(lease: Lease) -> list[Any]:
    return [lease.id, lease.session_id, lease.node_id, lease.cls, lease.granted_ms]


def load_state(data: dict[str, Any], config: EngineConfig) -> State:
    """Build a State from a snapshot; anything that does not fit raises SnapshotMismatch."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotMismatch(f"snapshot format is not {FORMAT!r}")
    try:
        return _load(data, config)
    except SnapshotMismatch:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SnapshotMismatch(f"snapshot does not decode: {exc!r}") from exc


def _load(data: dict[str, Any], config: EngineConfig) -> State:
    state = State(config)
    state.seq = int(data["seq"])
    state.next_id = int(data["next_id"])
    state.next_node_id = int(data["next_node_id"])
    state.nodes = {}
    for d in data["nodes"]:
        node = Node(
            d["id"],
            d["parent"],
            d["name"],
            0,
            dict(d["quotas"]),
            dict(d["limits"]),
            d["weight"],
            d["priority"],
            d["deadline_ms"],
            decode_value(Defaults | None, d["defaults"]),
            NodeState(d["state"]),
            d["ended_ms"],
            dict(d["used"]),
            dict(d["direct"]),
            dict(d["absorbed"]),
        )
        node.cooldowns = dict(d.get("cooldowns", {}))  # absent in snapshots before issue 17
        state.nodes[node.id] = node
    for node in sorted(state.nodes.values(), key=lambda n: n.id):
        if node.parent is not None:
            if node.parent not in state.nodes:
                raise SnapshotMismatch(f"node {node.id}: parent {node.parent} missing")
            state.nodes[node.parent].children.add(node.id)
    for node in state.nodes.values():
        node.depth = len(state.chain(node.id)) - 1
    for node in sorted(state.nodes.values(), key=lambda n: n.depth):  # parents first
        state.count_node(node, 1)
    for d in data["sessions"]:
        memory: OrderedDict[str, Any] = OrderedDict()
        for rid, fp, kind, raw in d["memory"]:
            memory[rid] = (fp, decode_value(_RESULTS[kind], raw))
        state.sessions[d["id"]] = Session(
            d["id"],
            d["scope_id"],
            d["ttl_ms"],
            d["token_sha256"],
            d["expires_ms"],
            SessionState(d["state"]),
            d["ended_ms"],
            set(),
            memory,
            d.get("key_sha256"),  # absent before key sessions were marked
        )
    for sid in sorted(state.sessions):
        session = state.sessions[sid]
        if session.state is SessionState.OPEN:
            state.by_token[session.token_sha256] = sid
            if session.key_sha256 is not None:
                state.by_key[session.key_sha256] = sid
    for raw in data["leases"]:
        lease = Lease(*raw)
        state.leases[lease.id] = lease
        state.sessions[lease.session_id].leases.add(lease.id)
        for node in state.chain(lease.node_id):
            node.held[lease.cls] = node.held.get(lease.cls, 0) + 1
    for raw, end, ended_ms in data["tombstones"]:
        lease = Lease(*raw)
        state.tombstones[lease.id] = Tombstone(lease, LeaseEnd(end), ended_ms)
    if "credit" in data:  # a snapshot from before credit blocks has none
        state.credit = load_credit(data["credit"])
    for cls, cfg, last_ms, samples, *window in data["adaptive"]:
        # A snapshot from before the served-concurrency window has none: it starts empty now.
        busy = state.nodes[ROOT_ID].held.get(cls, 0) > 0
        ok_ms, busy_ms, busy_since_ms = window or (0, 0, last_ms if busy else None)
        state.adaptive[cls] = AdaptiveState(
            decode_value(AdaptiveConfig, cfg),
            last_ms,
            [(int(a), bool(b)) for a, b in samples],
            int(ok_ms),
            int(busy_ms),
            None if busy_since_ms is None else int(busy_since_ms),
        )
    # A snapshot from before governord kept mesh policies has none: the book starts empty.
    state.policies = PolicyBook.load(data.get("policies"))
    return state

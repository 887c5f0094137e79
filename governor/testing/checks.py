"""Checkers that stand outside the engine: the auditor of emitted events (I1, I4, I5 and fencing
ids, and the credit ledger's C1-C4, see ``governor.testing.credit``), the state invariants (I2,
I3, I6, I7, I8, C1), and a canonical form of the durable state read straight from the engine's
objects, for comparing live and restored engines field by field."""

from __future__ import annotations

import enum
from typing import Any

from governor.engine import (
    ROOT_ID,
    Engine,
    Event,
    LeaseEnd,
    NodeState,
    SessionState,
)
from governor.engine import _events as ev
from governor.testing.credit import CreditLedger

__all__ = ["Auditor", "Violation", "canonical", "check_state", "first_diff"]


class Violation(AssertionError):
    pass


def _plain(value: Any) -> Any:
    if value is None or type(value) in (int, str, bool, float):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return sorted(value)
    fields = getattr(type(value), "__dataclass_fields__", None)
    if fields is not None:
        return {name: _plain(getattr(value, name)) for name in fields}
    return value


def canonical(engine: Engine) -> dict[str, Any]:
    """The durable state read straight from the engine's objects (not via the snapshot code),
    comparable across restores; session expiry is left out because heartbeats are not recorded."""
    st = engine.state
    nodes = {}
    for nid, n in st.nodes.items():
        d = _plain(n)
        d["held"] = {c: h for c, h in d["held"].items() if h}
        nodes[nid] = d
    sessions = {}
    for sid, s in st.sessions.items():
        d = _plain(s)
        d.pop("expires_ms")
        d["memory"] = [[rid, fp, type(r).__name__, _plain(r)] for rid, (fp, r) in s.memory.items()]
        sessions[sid] = d
    state: dict[str, Any] = _plain(
        {
            "seq": st.seq,
            "next_id": st.next_id,
            "next_node_id": st.next_node_id,
            "nodes": nodes,
            "sessions": sessions,
            "leases": st.leases,
            "tombstones": st.tombstones,
            "adaptive": st.adaptive,
            "credit": st.credit,
        }
    )
    state["policies"] = st.policies.dump()  # the mesh's policies (governord as coordinator)
    return state


class Auditor:
    """Checks I1, I4, I5 (and fencing ids) on each event, right after it is applied."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.events: list[Event] = []
        self.live: set[int] = set()
        self.ended: dict[int, tuple[LeaseEnd, int]] = {}
        self.max_id = 0
        self.charged: dict[str, int] = {}
        self.lowered = False
        self.credit = CreditLedger()  # C1-C4 (governor.testing.credit)

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        eng = self.engine
        if eng is None:
            return
        st = eng.state
        self.credit.on_event(eng, event)
        if isinstance(event, (ev.CreditGranted, ev.CreditReturned)):
            resource = self.credit.blocks[event.block_id].resource
            self.charged[resource] = self.charged.get(resource, 0) + self.credit.charged(
                resource, event
            )
        if isinstance(event, ev.Charged):
            self.charged[event.resource] = self.charged.get(event.resource, 0) + event.amount
            for a in st.chain(event.node_id):
                limit = a.quotas.get(event.resource)
                if limit is not None and a.used.get(event.resource, 0) > limit:
                    raise Violation(f"I1: consume took node {a.id} over its cap: {event}")
            if st.nodes[event.node_id].state is not NodeState.ACTIVE:
                raise Violation(f"I7: consume on an ended node: {event}")
        elif isinstance(event, ev.LeaseGranted):
            if event.lease_id <= self.max_id:
                raise Violation(f"fencing: lease id {event.lease_id} not above {self.max_id}")
            self.max_id = event.lease_id
            self.live.add(event.lease_id)
            for a in st.chain(event.node_id):
                limit = a.limits.get(event.cls)
                if limit is not None and a.held.get(event.cls, 0) > limit:
                    raise Violation(f"I4: grant took node {a.id} over its limit: {event}")
            if st.nodes[event.node_id].state is not NodeState.ACTIVE:
                raise Violation(f"I7: grant on an ended node: {event}")
        elif isinstance(event, ev.LeaseEnded):
            if event.lease_id not in self.live:
                raise Violation(f"I5: lease {event.lease_id} ended twice or never granted")
            self.live.discard(event.lease_id)
            self.ended[event.lease_id] = (event.end, event.at_ms)
        elif isinstance(event, ev.SessionOpened):
            if event.session_id <= self.max_id:
                raise Violation(f"fencing: session id {event.session_id} reissued")
            self.max_id = event.session_id


def check_state(engine: Engine, auditor: Auditor, terminal: dict[int, NodeState]) -> None:
    st = engine.state
    nodes = st.nodes
    # I2 quota conservation
    for n in nodes.values():
        for r in set(n.used) | set(n.direct) | set(n.absorbed):
            total = n.direct.get(r, 0) + n.absorbed.get(r, 0)
            total += sum(nodes[c].used.get(r, 0) for c in n.children)
            if total != n.used.get(r, 0):
                raise Violation(f"I2: node {n.id} {r}: used {n.used.get(r, 0)} != parts {total}")
    for r, amount in auditor.charged.items():
        if nodes[ROOT_ID].used.get(r, 0) != amount:
            raise Violation(f"I2: root {r} used != sum of charges {amount}")
    # I3 lease conservation, I6 no orphaned leases
    held: dict[tuple[int, str], int] = {}
    for lease in st.leases.values():
        for a in st.chain(lease.node_id):
            held[(a.id, lease.cls)] = held.get((a.id, lease.cls), 0) + 1
        session = st.sessions.get(lease.session_id)
        if session is None or session.state is not SessionState.OPEN:
            raise Violation(f"I6: lease {lease.id} outlives its session")
        if lease.id not in session.leases:
            raise Violation(f"I3: lease {lease.id} missing from its session")
        if nodes[lease.node_id].state is not NodeState.ACTIVE:
            raise Violation(f"I6: lease {lease.id} on an ended node")
    for n in nodes.values():
        for c, h in n.held.items():
            if h != held.get((n.id, c), 0):
                raise Violation(f"I3: node {n.id} {c}: held {h} != live leases")
    if set(st.leases) != auditor.live:
        raise Violation("I3/I5: live leases differ from the auditor's record")
    # I7 terminal is final
    for nid, state in list(terminal.items()):
        node = nodes.get(nid)
        if node is not None and node.state is not state:
            raise Violation(f"I7: node {nid} left terminal state {state}")
    for n in nodes.values():
        if n.state.terminal:
            terminal.setdefault(n.id, n.state)
            for child in n.children:
                if not nodes[child].state.terminal:
                    raise Violation(f"I7: live child {child} under ended node {n.id}")
    # C1 level + outstanding <= B, against the grants the auditor saw
    auditor.credit.check_buckets(engine, engine._now_ms)
    # I8 work conserving
    for w in engine.queued():
        if engine._fits(nodes[w.node_id], w.cls) is None:
            raise Violation(f"I8: queued waiter {w.id} fits")


def first_diff(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return first_diff(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_diff(x, y, f"{path}[{i}]")
    return f"{path}: live {a!r} vs restored {b!r}"

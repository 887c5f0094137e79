"""The durable state and the one function that changes it: ``State.apply(event)``.

Live calls decide, then emit an event that is applied here; a restore applies the recorded events
here too. There is no second code path, so replay equals live by construction (and the tests check
it field by field).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _events as ev
from ._creditbook import CreditBook
from ._policybook import PolicyBook
from ._types import (
    NODE_TRANSITIONS,
    SESSION_TRANSITIONS,
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
    RequestTag,
    SessionState,
)

__all__ = ["AdaptiveState", "Lease", "Node", "ROOT_ID", "Session", "State", "Tombstone"]

ROOT_ID = 1
Result = Consumed | Granted | Released | Created | Edited | CreditGrant | CreditReturn


@dataclass(slots=True)
class Node:
    id: int
    parent: int | None
    name: str
    depth: int
    quotas: dict[str, int]
    limits: dict[str, int]
    weight: int
    priority: int
    deadline_ms: int | None
    defaults: Defaults | None
    state: NodeState = NodeState.ACTIVE
    ended_ms: int | None = None
    used: dict[str, int] = field(default_factory=dict)  # whole subtree, removed children included
    direct: dict[str, int] = field(default_factory=dict)  # consumed at this node itself
    absorbed: dict[str, int] = field(default_factory=dict)  # usage of removed children
    held: dict[str, int] = field(default_factory=dict)  # live leases in the subtree, per class
    children: set[int] = field(default_factory=set)
    # name -> until (epoch ms): a fleet-wide "back off" set by a caller that saw a 429
    # (`gov`, docs/gov.md); at most COOLDOWNS_PER_NODE_MAX live ones, expired ones dropped.
    cooldowns: dict[str, int] = field(default_factory=dict)
    # The child of the root this node is under (itself for a tenant, None for the root): the
    # subtree whose size EngineConfig.nodes_per_tenant_max bounds (State.tenant_nodes).
    tenant: int | None = None


@dataclass(slots=True)
class Session:
    id: int
    scope_id: int
    ttl_ms: int
    token_sha256: str
    expires_ms: int
    state: SessionState = SessionState.OPEN
    ended_ms: int | None = None
    leases: set[int] = field(default_factory=set)
    memory: OrderedDict[str, tuple[str, Result]] = field(default_factory=OrderedDict)
    key_sha256: str | None = None  # a bare API key's session: the key's digest


@dataclass(slots=True)
class Lease:
    id: int
    session_id: int
    node_id: int
    cls: str
    granted_ms: int


@dataclass(slots=True)
class Tombstone:
    """An ended lease, kept ``tombstone_ms`` so a late release learns how it ended."""

    lease: Lease
    end: LeaseEnd
    ended_ms: int


@dataclass(slots=True)
class AdaptiveState:
    """The evidence one adaptive class has gathered since its limit last moved (``last_adjust_ms``).

    ``samples`` (latency, overloaded) come only from leases granted in this window: a lease granted
    under the previous limit says nothing about the current one, so the limit moves at most once
    per round trip. ``ok_ms`` is lease time inside the window of leases that ended without being
    reported overloaded; ``busy_ms`` is window time with any lease of the class held (closed
    spells; ``busy_since_ms`` starts the open one). By Little's law their ratio is the concurrency
    the downstream served, in the units the limit counts (held leases).
    """

    config: AdaptiveConfig
    last_adjust_ms: int
    samples: list[tuple[int, bool]] = field(default_factory=list)
    ok_ms: int = 0
    busy_ms: int = 0
    busy_since_ms: int | None = None


class State:
    """Everything that survives a restart, plus the counters that make ids never reissued."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.seq = 0
        self.next_id = 1  # sessions and leases: one counter that only grows (fencing ids)
        self.next_node_id = ROOT_ID + 1
        self.nodes: dict[int, Node] = {
            ROOT_ID: Node(ROOT_ID, None, "root", 0, {}, {}, 1, 0, None, None)
        }
        self.sessions: dict[int, Session] = {}
        self.by_token: dict[str, int] = {}  # sha256 of an open session's token -> session id
        self.by_key: dict[str, int] = {}  # sha256 of an API key -> its open key session
        # tenant (a child of the root) -> nodes in its subtree, itself included, ended ones
        # until purged: what EngineConfig.nodes_per_tenant_max bounds. Derived, not stored.
        self.tenant_nodes: dict[int, int] = {}
        self.leases: dict[int, Lease] = {}
        self.tombstones: dict[int, Tombstone] = {}
        self.credit = CreditBook()  # rated buckets and credit blocks (see _creditbook)
        self.adaptive: dict[str, AdaptiveState] = {}
        self.policies = PolicyBook()  # the mesh's policies (governord as coordinator)
        self._handlers: dict[type[Any], Callable[[Any], None]] = {
            ev.SessionOpened: self._session_opened,
            ev.SessionClosed: self._session_closed,
            ev.SessionExpired: self._session_expired,
            ev.NodeCreated: self._node_created,
            ev.Charged: self._charged,
            ev.RateSet: lambda e: self.credit.rate_set(self, e),
            ev.CreditGranted: lambda e: self.credit.credit_granted(self, e),
            ev.CreditReturned: lambda e: self.credit.credit_returned(self, e),
            ev.QuotaSet: self._quota_set,
            ev.LimitSet: self._limit_set,
            ev.DefaultsSet: self._defaults_set,
            ev.WeightSet: self._weight_set,
            ev.DeadlineSet: self._deadline_set,
            ev.CooldownSet: self._cooldown_set,
            ev.NodeEnded: self._node_ended,
            ev.LeaseGranted: self._lease_granted,
            ev.LeaseEnded: self._lease_ended,
            ev.AdaptiveSet: self._adaptive_set,
            ev.LimitAdjusted: self._limit_adjusted,
            ev.PolicyPut: self._policy_put,
            ev.PolicyRemoved: self._policy_removed,
        }

    # ---- the one code path --------------------------------------------------------------

    def apply(self, event: ev.Event) -> None:
        """Apply one event; the caller guarantees ``event.seq == self.seq + 1``."""
        self._handlers[type(event)](event)
        self.seq = event.seq

    def chain(self, node_id: int) -> list[Node]:
        """The node and its ancestors, leaf first."""
        out = []
        cur: int | None = node_id
        while cur is not None:
            node = self.nodes[cur]
            out.append(node)
            cur = node.parent
        return out

    def count_node(self, node: Node, delta: int) -> None:
        """A node joins (+1) or leaves (-1, purged) its tenant's count; sets ``node.tenant``."""
        if node.parent is None:
            return
        parent = self.nodes[node.parent]
        node.tenant = node.id if parent.parent is None else parent.tenant
        assert node.tenant is not None
        held = self.tenant_nodes.get(node.tenant, 0) + delta
        assert held >= 0, "a tenant's count never goes below zero"
        if held:
            self.tenant_nodes[node.tenant] = held
        else:
            self.tenant_nodes.pop(node.tenant, None)

    def remember(self, session_id: int | None, tag: RequestTag | None, result: Result) -> None:
        if tag is None or session_id is None:
            return
        session = self.sessions.get(session_id)
        if session is None:
            return
        memory = session.memory
        memory[tag.request_id] = (tag.fingerprint, result)
        memory.move_to_end(tag.request_id)
        while len(memory) > self.config.request_memory_max:
            memory.popitem(last=False)

    # ---- handlers -----------------------------------------------------------------------

    def _session_opened(self, e: ev.SessionOpened) -> None:
        self.sessions[e.session_id] = Session(
            e.session_id,
            e.scope_id,
            e.ttl_ms,
            e.token_sha256,
            e.at_ms + e.ttl_ms,
            key_sha256=e.key_sha256,
        )
        self.next_id = max(self.next_id, e.session_id + 1)
        self.by_token[e.token_sha256] = e.session_id
        if e.key_sha256 is not None:
            self.by_key[e.key_sha256] = e.session_id

    def _end_session(self, session_id: int, state: SessionState, at_ms: int) -> None:
        session = self.sessions[session_id]
        assert state in SESSION_TRANSITIONS[session.state], "an ended session stays ended"
        assert not session.leases, "leases end (as events) before their session does"
        session.state = state
        session.ended_ms = at_ms
        session.memory.clear()
        if self.by_token.get(session.token_sha256) == session_id:
            del self.by_token[session.token_sha256]
        if session.key_sha256 is not None and self.by_key.get(session.key_sha256) == session_id:
            del self.by_key[session.key_sha256]

    def _session_closed(self, e: ev.SessionClosed) -> None:
        self._end_session(e.session_id, SessionState.CLOSED, e.at_ms)

    def _session_expired(self, e: ev.SessionExpired) -> None:
        self._end_session(e.session_id, SessionState.EXPIRED, e.at_ms)

    def _node_created(self, e: ev.NodeCreated) -> None:
        parent = self.nodes[e.parent_id]
        self.nodes[e.node_id] = Node(
            e.node_id,
            e.parent_id,
            e.name,
            parent.depth + 1,
            dict(e.quotas),
            dict(e.limits),
            e.weight,
            e.priority,
            e.deadline_ms,
            e.defaults,
        )
        parent.children.add(e.node_id)
        self.count_node(self.nodes[e.node_id], 1)
        self.next_node_id = max(self.next_node_id, e.node_id + 1)
        self.credit.node_created(e.node_id, e.rates, e.at_ms)
        self.remember(e.session_id, e.request, Created(e.node_id))

    def _charged(self, e: ev.Charged) -> None:
        resource, amount = e.resource, e.amount
        for node in self.chain(e.node_id):
            node.used[resource] = node.used.get(resource, 0) + amount
        target = self.nodes[e.node_id]
        target.direct[resource] = target.direct.get(resource, 0) + amount
        if e.request is not None:
            self.remember(e.session_id, e.request, Consumed(e.node_id, resource, amount))

    def _quota_set(self, e: ev.QuotaSet) -> None:
        quotas = self.nodes[e.node_id].quotas
        if e.limit is None:
            quotas.pop(e.resource, None)
        else:
            quotas[e.resource] = e.limit
        self.remember(e.session_id, e.request, Edited(e.node_id))

    def _limit_set(self, e: ev.LimitSet) -> None:
        limits = self.nodes[e.node_id].limits
        if e.limit is None:
            limits.pop(e.cls, None)
        else:
            limits[e.cls] = e.limit
        self.remember(e.session_id, e.request, Edited(e.node_id))

    def _defaults_set(self, e: ev.DefaultsSet) -> None:
        self.nodes[e.node_id].defaults = e.defaults
        self.remember(e.session_id, e.request, Edited(e.node_id))

    def _weight_set(self, e: ev.WeightSet) -> None:
        self.nodes[e.node_id].weight = e.weight
        self.remember(e.session_id, e.request, Edited(e.node_id))

    def _deadline_set(self, e: ev.DeadlineSet) -> None:
        self.nodes[e.node_id].deadline_ms = e.deadline_ms
        self.remember(e.session_id, e.request, Edited(e.node_id))

    def _cooldown_set(self, e: ev.CooldownSet) -> None:
        node = self.nodes[e.node_id]
        node.cooldowns = {k: v for k, v in node.cooldowns.items() if v > e.at_ms}
        if e.until_ms > e.at_ms:
            node.cooldowns[e.name] = e.until_ms
        else:
            node.cooldowns.pop(e.name, None)
        self.remember(e.session_id, e.request, Edited(e.node_id))

    def _node_ended(self, e: ev.NodeEnded) -> None:
        node = self.nodes[e.node_id]
        assert e.state in NODE_TRANSITIONS[node.state], "terminal states are final"
        assert not any(node.held.values()), "a node ends only after its leases have ended"
        node.state = e.state
        node.ended_ms = e.at_ms
        self.remember(e.session_id, e.request, Edited(e.node_id))

    def _lease_granted(self, e: ev.LeaseGranted) -> None:
        lease = Lease(e.lease_id, e.session_id, e.node_id, e.cls, e.at_ms)
        self.leases[e.lease_id] = lease
        self.sessions[e.session_id].leases.add(e.lease_id)
        for node in self.chain(e.node_id):
            node.held[e.cls] = node.held.get(e.cls, 0) + 1
        adaptive = self.adaptive.get(e.cls)
        if adaptive is not None and self.nodes[ROOT_ID].held[e.cls] == 1:
            adaptive.busy_since_ms = e.at_ms
        self.next_id = max(self.next_id, e.lease_id + 1)
        self.remember(e.session_id, e.request, Granted(e.lease_id, e.node_id, e.cls))

    def _lease_ended(self, e: ev.LeaseEnded) -> None:
        lease = self.leases.pop(e.lease_id)
        self.sessions[lease.session_id].leases.discard(e.lease_id)
        for node in self.chain(lease.node_id):
            node.held[lease.cls] -= 1
        self.tombstones[e.lease_id] = Tombstone(lease, e.end, e.at_ms)
        adaptive = self.adaptive.get(lease.cls)
        if adaptive is not None:
            self._adaptive_lease_ended(adaptive, lease, e)
        self.remember(lease.session_id, e.request, Released(e.lease_id, e.end, True))

    def _adaptive_lease_ended(self, a: AdaptiveState, lease: Lease, e: ev.LeaseEnded) -> None:
        """Book one ended lease into its class's window (called after ``held`` went down)."""
        if not e.overloaded:  # a lease that ended unreported was not refused either
            a.ok_ms += max(0, e.at_ms - max(lease.granted_ms, a.last_adjust_ms))
        if e.latency_ms is not None and lease.granted_ms >= a.last_adjust_ms:
            a.samples.append((e.latency_ms, e.overloaded))
            del a.samples[: -self.config.adaptive_samples_max]
        if self.nodes[ROOT_ID].held[lease.cls] == 0 and a.busy_since_ms is not None:
            a.busy_ms += max(0, e.at_ms - max(a.busy_since_ms, a.last_adjust_ms))
            a.busy_since_ms = None

    def _adaptive_set(self, e: ev.AdaptiveSet) -> None:
        if e.config is None:
            self.adaptive.pop(e.cls, None)
            return
        busy = self.nodes[ROOT_ID].held.get(e.cls, 0) > 0
        self.adaptive[e.cls] = AdaptiveState(
            e.config, e.at_ms, busy_since_ms=e.at_ms if busy else None
        )
        self.nodes[ROOT_ID].limits[e.cls] = e.config.initial_limit

    def _limit_adjusted(self, e: ev.LimitAdjusted) -> None:
        state = self.adaptive[e.cls]
        state.samples.clear()
        state.ok_ms = state.busy_ms = 0
        state.last_adjust_ms = e.at_ms
        self.nodes[ROOT_ID].limits[e.cls] = e.limit

    def _policy_put(self, e: ev.PolicyPut) -> None:
        self.policies.put(e)

    def _policy_removed(self, e: ev.PolicyRemoved) -> None:
        self.policies.removed(e)

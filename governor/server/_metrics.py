"""Prometheus metrics of governord. Labels are tenants, classes and resources only, never a
task, so the number of series grows with the configuration and not with the work. The tree is
read once per scrape (root and tenants only) under the engine's lock. ``public`` is the same
without the tenant-labelled series (what a caller without the pages token sees off
loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from governor.authority import Authority
from governor.engine import ROOT_ID, Engine, Event, NodeState, SessionState
from ratemesh.publicmetrics import public_registry, register_standard

__all__ = ["Metrics"]

_LAT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30)


class _TreeCollector(Collector):
    def __init__(self, authority: Authority) -> None:
        self._authority = authority

    def collect(self) -> Iterator[Any]:
        rows = self._authority.read(_read_tree)
        depth = GaugeMetricFamily(
            "governor_queue_depth", "Acquires waiting in the fair queue", labels=["cls"]
        )
        held = GaugeMetricFamily("governor_pool_held", "Leases held at the root", labels=["cls"])
        limit = GaugeMetricFamily("governor_pool_limit", "Root concurrency limit", labels=["cls"])
        spend = GaugeMetricFamily(
            "governor_tenant_spend", "Quota spent by tenant", labels=["tenant", "resource"]
        )
        tenant_held = GaugeMetricFamily(
            "governor_tenant_held", "Leases held by tenant", labels=["tenant", "cls"]
        )
        credit_level = GaugeMetricFamily(
            "governor_credit_level",
            "Credit left in a rated tenant's bucket",
            labels=["tenant", "resource"],
        )
        credit_out = GaugeMetricFamily(
            "governor_credit_outstanding",
            "Units of a rated tenant's credit blocks out in workers' hands",
            labels=["tenant", "resource"],
        )
        nodes = GaugeMetricFamily("governor_nodes", "Active nodes in the tree")
        sessions = GaugeMetricFamily("governor_sessions", "Open sessions")
        for cls, n in rows["depth"].items():
            depth.add_metric([cls], n)
        for cls, n in rows["held"].items():
            held.add_metric([cls], n)
        for cls, n in rows["limit"].items():
            limit.add_metric([cls], n)
        for (tenant, res), n in rows["spend"].items():
            spend.add_metric([tenant, res], n)
        for (tenant, cls), n in rows["tenant_held"].items():
            tenant_held.add_metric([tenant, cls], n)
        for (tenant, res), (level, out) in rows["credit"].items():
            credit_level.add_metric([tenant, res], level)
            credit_out.add_metric([tenant, res], out)
        nodes.add_metric([], rows["nodes"])
        sessions.add_metric([], rows["sessions"])
        yield from (depth, held, limit, spend, tenant_held, credit_level, credit_out, nodes)
        yield sessions


def _read_tree(engine: Engine) -> dict[str, Any]:
    st = engine.state
    root = st.nodes[ROOT_ID]
    depth: dict[str, int] = {}
    for w in engine.queued():
        depth[w.cls] = depth.get(w.cls, 0) + 1
    spend: dict[tuple[str, str], int] = {}
    tenant_held: dict[tuple[str, str], int] = {}
    credit: dict[tuple[str, str], tuple[int, int]] = {}
    for (nid, res), _bucket in sorted(st.credit.buckets.items()):
        if nid in root.children:  # tenants only: labels stay bounded by the config
            view = engine.credit_level(nid, res)
            if view is not None:
                credit[(st.nodes[nid].name, res)] = (view[0], view[1])
    for cid in sorted(root.children):
        t = st.nodes[cid]
        for res, n in t.used.items():
            spend[(t.name, res)] = n
        for cls, n in t.held.items():
            tenant_held[(t.name, cls)] = n
    return {
        "depth": depth,
        "held": dict(root.held),
        "limit": dict(root.limits),
        "spend": spend,
        "tenant_held": tenant_held,
        "credit": credit,
        "nodes": sum(1 for n in st.nodes.values() if n.state is NodeState.ACTIVE),
        "sessions": sum(1 for s in st.sessions.values() if s.state is SessionState.OPEN),
    }


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.public = public_registry(self.registry)
        r = self.registry
        self.calls = Counter(
            "governor_calls", "Calls by method and status code", ["method", "code"], registry=r
        )
        self.latency = Histogram(
            "governor_call_seconds",
            "Call latency, reply after commit",
            ["method"],
            buckets=_LAT_BUCKETS,
            registry=r,
        )
        self.events = Counter("governor_events", "Events by kind", ["kind"], registry=r)
        self.leader = Gauge(
            "governor_leader", "1 while this governord leads, 0 while it is a standby", registry=r
        )
        self.epoch = Gauge(
            "governor_leader_epoch",
            "The leader row's epoch as this process last saw it",
            registry=r,
        )
        self.commit_seconds = Histogram(
            "governor_commit_seconds",
            "Duration of one group commit",
            buckets=_LAT_BUCKETS,
            registry=r,
        )
        self.commit_batch = Histogram(
            "governor_commit_batch_events",
            "Events per group commit",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024),
            registry=r,
        )

    def attach(self, authority: Authority) -> None:
        self.registry.register(_TreeCollector(authority))
        register_standard(self.registry, "governord")
        by_kind: dict[type[Any], Any] = {}

        def on_event(event: Event) -> None:
            child = by_kind.get(type(event))
            if child is None:
                child = by_kind[type(event)] = self.events.labels(type(event).__name__)
            child.inc()

        def on_commit(_seq: int, n: int, took: float) -> None:
            self.commit_seconds.observe(took)
            self.commit_batch.observe(n)

        authority.event_listeners.append(on_event)
        authority.log.commit_listeners.append(on_commit)

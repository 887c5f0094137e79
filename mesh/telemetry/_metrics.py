"""Counters the node keeps cheaply (plain dicts on the hot path) and exports at scrape.

`try_admit` must stay cheap, so decisions are counted in a dict keyed by (tenant, metric,
mode, reason, suspension) and turned into Prometheus families only when scraped. Delays
are real Histograms: they are observed once per acknowledged report, not per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mesh.core.verdict import Reason, Verdict

__all__ = ["Telemetry", "NodeStats", "TENANTS_MAX", "DecisionKey"]

TENANTS_MAX = 1000  # distinct tenant label values; beyond it they count as "_other"
_STALE = {Reason.SNAPSHOT_STALE.value, Reason.OWNER_UNREACHABLE.value}
DELAY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0)

DecisionKey = tuple[str, str, int]  # tenant, metric, id() of an interned Verdict


@dataclass(slots=True)
class NodeStats:
    """What the node reports at scrape time, per (tenant, metric)."""

    applied: dict[tuple[str, str], int] = field(default_factory=dict)
    active_reporters: dict[tuple[str, str], int] = field(default_factory=dict)
    excess: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # est, bound
    members: int = 1
    ring_epoch: int = 0
    membership_stale: bool = False
    messages_sent: int = 0


class Telemetry:
    def __init__(self, stats: Callable[[], NodeStats]) -> None:
        self.registry = CollectorRegistry()
        self.decisions: dict[DecisionKey, int] = {}
        self.verdicts: dict[int, Verdict] = {}  # keeps each counted verdict (and its id) alive
        self._tenants: set[str] = set()
        self.report_delay = Histogram(
            "ratemesh_report_delay_seconds",
            "From sending a usage report to the owner's snapshot acknowledging it (d)",
            ("metric",),
            buckets=DELAY_BUCKETS_S,
            registry=self.registry,
        )
        self.snapshot_delay = Histogram(
            "ratemesh_snapshot_delay_seconds",
            "Age of a key's view when the next snapshot for it arrives (owners send one "
            "when the view would change; their batches keep it fresh in between)",
            ("metric",),
            buckets=DELAY_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_Collector(self, stats))

    def tenant_label(self, tenant: str) -> str:
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < TENANTS_MAX:
            self._tenants.add(tenant)
            return tenant
        return "_other"

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Collector(Collector):
    def __init__(self, tel: Telemetry, stats: Callable[[], NodeStats]) -> None:
        self.tel = tel
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        lab = ["tenant", "metric", "mode", "reason"]
        admitted = CounterMetricFamily(
            "ratemesh_admitted", "Local decisions that admitted", labels=lab
        )
        denied = CounterMetricFamily("ratemesh_denied", "Local decisions that denied", labels=lab)
        stale = CounterMetricFamily(
            "ratemesh_stale_view_rejections",
            "Denials because the owner's view was stale or unreachable",
            labels=lab,
        )
        suspended = CounterMetricFamily(
            "ratemesh_suspended_verdicts",
            "Verdicts given while degraded, by suspension reason",
            labels=lab,
        )
        folded: dict[tuple[str, str, str, str, str], int] = {}
        for (tenant, metric, vid), n in list(self.tel.decisions.items()):
            v = self.tel.verdicts[vid]
            t = self.tel.tenant_label(tenant)
            k = (
                t,
                metric,
                v.mode.value if v.mode else "none",
                v.reason.value,
                v.suspended.value if v.suspended else "",
            )
            folded[k] = folded.get(k, 0) + n
        susp_sum: dict[tuple[str, str, str, str], int] = {}
        for (t, metric, mode, reason, susp), n in sorted(folded.items()):
            fam = admitted if reason == Reason.ADMITTED.value else denied
            fam.add_metric([t, metric, mode, reason], n)
            if reason in _STALE:
                stale.add_metric([t, metric, mode, reason], n)
            if susp:
                sk = (t, metric, mode, susp)
                susp_sum[sk] = susp_sum.get(sk, 0) + n
        for sk, n in sorted(susp_sum.items()):
            suspended.add_metric(list(sk), n)
        yield from (admitted, denied, stale, suspended)

        s = self.stats()
        applied = CounterMetricFamily(
            "ratemesh_owner_applied",
            "Usage applied by this member as owner (units or bytes)",
            labels=["tenant", "metric"],
        )
        for (t, m), n in sorted(s.applied.items()):
            applied.add_metric([self.tel.tenant_label(t), m], n)
        yield applied
        active = GaugeMetricFamily(
            "ratemesh_active_reporters",
            "Active reporters of keys this member owns",
            labels=["tenant", "metric"],
        )
        for (t, m), n in sorted(s.active_reporters.items()):
            active.add_metric([self.tel.tenant_label(t), m], n)
        yield active
        est = GaugeMetricFamily(
            "ratemesh_excess_estimate",
            "Estimated fleet excess over the ideal limiter (units)",
            labels=["tenant", "metric"],
        )
        bound = GaugeMetricFamily(
            "ratemesh_excess_bound", "The envelope N*b + R*d (units)", labels=["tenant", "metric"]
        )
        for (t, m), (e, b) in sorted(s.excess.items()):
            est.add_metric([self.tel.tenant_label(t), m], e)
            bound.add_metric([self.tel.tenant_label(t), m], b)
        yield est
        yield bound
        yield GaugeMetricFamily("ratemesh_members", "Live members in the ring", value=s.members)
        yield GaugeMetricFamily("ratemesh_ring_epoch", "The ring epoch", value=s.ring_epoch)
        yield GaugeMetricFamily(
            "ratemesh_membership_stale", "1 if membership is stale", value=int(s.membership_stale)
        )
        yield CounterMetricFamily(
            "ratemesh_peer_messages_sent", "Peer messages sent", value=s.messages_sent
        )

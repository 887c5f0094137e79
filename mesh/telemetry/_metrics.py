"""Counters the node keeps cheaply (plain dicts on the hot path) and exports at scrape.

`try_admit` must stay cheap, so decisions are counted in a dict keyed by (tenant, metric,
id(verdict)) and turned into Prometheus families only when scraped. Delays are real
Histograms: they are observed once per acknowledged report, not per request.

Bounded labels: only the top `top_k` tenants by denials, then excess estimate,
then admissions get series of their own; the rest are summed under tenant="other", and a
tenant with no known policy is never a label value (its decisions count under "other",
reason="policy_unknown"). Metric names are open, so the same holds for them: a
decision on a metric no current policy declares counts under metric="other". Which tenants
are labelled may change between scrapes. Counters stay monotonic per label while the set of
labels changes: a tenant entering the top-K starts a series at 0 (what it had before stays
in "other"); one leaving it hands its total to "other", which takes its later increments
too. Prometheus tolerates series appearing and disappearing; summed over labels, a counter
never decreases. A tenant named "other" has no series of its own (it would collide with the
sum).

Forgetting: `forget_idle` (the node calls it every `DECISIONS_IDLE_S`) drops the decision
counts of tenants that did not change since the previous call, keeping their totals per
series, so the hot path's dict holds recently active tenants only.

Units admitted (`ratemesh_admitted_units_total`, counted by the node off the hot path:
mesh/node/_units.py) follow the same labelled tenants and the same rules as the decision
counters. Each limit's numbers (`ratemesh_limit_rate`, `ratemesh_limit_burst`) are gauges
for the same tenants, plus tenants with a policy by name in the slots left free (as
`ratemesh_policy_generation`); tenant="other" carries the largest among the limits without
a series of their own, per metric, the default policies' ("*") always among them, since
they apply to every tenant not labelled (docs/telemetry.md).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mesh.core.gate import Gate
from mesh.core.policy import DEFAULT_TENANT, TenantRatePolicy
from mesh.core.verdict import Reason, Verdict
from mesh.telemetry._shadow import ShadowTelemetry
from ratemesh.policy import DESCRIPTOR_SEP, DESCRIPTOR_WILDCARD, split_tenant
from ratemesh.publicmetrics import public_registry

__all__ = [
    "Telemetry",
    "NodeStats",
    "TOP_K",
    "OTHER",
    "DECISIONS_IDLE_S",
    "DecisionKey",
    "rate_and_burst",
]

TOP_K = 50  # tenants with series of their own (node config: telemetry_top_k)
OTHER = "other"  # the label the remaining tenants are summed under
DECISIONS_IDLE_S = 30.0  # decision counts unchanged this long are folded and forgotten
_STALE = {Reason.SNAPSHOT_STALE.value, Reason.OWNER_UNREACHABLE.value}
DELAY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0)

DecisionKey = tuple[str, str, int]  # tenant, metric, id() of an interned Verdict
Series = tuple[str, str, str, str]  # metric, mode, reason, suspension ("" if none)
S = TypeVar("S", bound=Hashable)


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
    # peer streams refused, by reason (mesh.peer: a fixed set of reasons, never a peer id)
    peer_refused: dict[str, int] = field(default_factory=dict)
    # (tenant, metric) -> the generation enforced
    enforced: dict[tuple[str, str], int] = field(default_factory=dict)
    policy_reloads: int = 0  # policy file reloads accepted
    policy_reloads_refused: dict[str, int] = field(default_factory=dict)  # by reason
    # the strict credit client's counters (mesh/node/_credit.py stats(); empty without a
    # `strict:` section): a fixed set of event names, never a tenant
    strict: dict[str, int] = field(default_factory=dict)
    # redis mode (docs/redis.md): None without a tier; decisions Redis made, the embedded
    # limiter's answers by cause, and 1 while the breaker is not closed
    redis_answered: int | None = None
    redis_fallbacks: dict[str, int] = field(default_factory=dict)
    redis_breaker_open: int = 0
    # Units admitted here per (tenant, metric, mode) since the limit was last idle (the
    # node's AdmittedUnits, net of refunds, at their highest), and per (metric, mode)
    # ever, the limits forgotten since included
    admitted_units: dict[tuple[str, str, str], int] = field(default_factory=dict)
    admitted_units_totals: dict[tuple[str, str], int] = field(default_factory=dict)
    # (tenant, metric) -> (R in units per second, B in units) of each current policy by
    # name that has a rate (`rate_and_burst`)
    limits: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # As owner: units charged to keys for silent members' floors (escrow), and of them the
    # units their reports later netted (docs/partitions.md): charged less netted is
    # capacity held back from the other members.
    escrow_charged: int = 0
    escrow_netted: int = 0
    escrow_refunded: int = 0  # charged, never reported, given back when the escrow closed
    # Failures said out loud rather than only logged at debug: replies on this member's
    # peer links that failed validation or were not a reply (each changed nothing), calls
    # to the spend quotas' cell tier that failed (the owners' folds still count), and young
    # collections run because peer streams were refused (mesh/node/_driver.py)
    peer_bad_replies: int = 0
    cell_tier_errors: int = 0
    refused_stream_collections: int = 0


def rate_and_burst(p: TenantRatePolicy) -> tuple[float, float] | None:
    """A limit's R (units per second, exact for a rate not whole per second: "1/minute" is
    1/60) and B (units); None for a policy with no rate to export (disabled, a quota)."""
    if not p.enabled or p.quota is not None or p.target_rate <= 0:
        return None
    return p.target_rate / p.scale, p.global_burst / p.scale


class Telemetry:
    def __init__(
        self,
        stats: Callable[[], NodeStats],
        *,
        top_k: int = TOP_K,
        metric_declared: Callable[[str], bool] | None = None,
        policy_of: Callable[[str, str], TenantRatePolicy | None] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        # Whether a current policy names the metric (the node's policy cache); None: all are.
        self._metric_declared = metric_declared
        # The current policy for a (tenant, metric) (the node's policy cache, defaults
        # resolved): the numbers of a labelled tenant's limit that has no policy by name.
        self._policy_of = policy_of
        self.top_k = top_k
        self.decisions: dict[DecisionKey, int] = {}
        self.verdicts: dict[int, Verdict] = {}  # keeps each counted verdict (and its id) alive
        self._lock = threading.Lock()  # scrapes and forget_idle; never the hot path
        self._seen: dict[DecisionKey, int] = {}  # decisions at the last forget_idle
        self._forgotten: dict[Series, int] = {}  # totals of forgotten decision counts
        self._folded = 0  # counts folded by forget_view since the last forget_idle
        # /health's per-limit counts of dropped entries, (tenant, metric) -> [admitted,
        # denied], kept while the limit has a live entry (so bounded by the live ones)
        self._limit_folded: dict[tuple[str, str], list[int]] = {}
        self._decided: _Labelled[Series] = _Labelled()
        self._applied: _Labelled[str] = _Labelled()
        self._retired: dict[str, int] = {}  # the owner's forgotten keys' units, per metric
        self._units: _Labelled[tuple[str, str]] = _Labelled()  # series: (metric, mode)
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
        self.shadow = ShadowTelemetry(_Labelled, _label)  # shadow posture (docs/policies.md)
        self._collector = _Collector(self, stats)
        self.registry.register(self._collector)
        self._public = public_registry(self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def render_public(self) -> bytes:
        """/metrics without the tenant-labelled series: what a caller off loopback without
        the operator token sees (docs/security.md)."""
        return generate_latest(self._public)

    def limit_numbers(self) -> dict[tuple[str, str], dict[str, float]]:
        """Per (tenant label, metric): this member's admitted and denied decisions, and the
        excess estimate beside its bound, for /health and the /ui page. The counts run
        since the limit was last idle (all its decision counts forgotten, `forget_idle` or
        `forget_view`: it starts again from 0) and never go down in between. Reads the
        counts without ranking them, so scrapes see nothing of it."""
        s = self._collector.stats()
        out: dict[tuple[str, str], dict[str, float]] = {}
        with self._lock:
            counted = list(self.decisions.items())
            verdicts = self.verdicts
            for (tenant, metric), (adm, den) in self._limit_folded.items():
                row = out.setdefault((_label(tenant), metric), {"admitted": 0, "denied": 0})
                row["admitted"] += adm
                row["denied"] += den
            for (tenant, metric, vid), n in counted:
                v = verdicts.get(vid)
                if v is None:
                    continue
                row = out.setdefault((_label(tenant), metric), {"admitted": 0, "denied": 0})
                row["admitted" if v.reason is Reason.ADMITTED else "denied"] += n
        for (tenant, metric), (est, bound) in s.excess.items():
            row = out.setdefault((_label(tenant), metric), {"admitted": 0, "denied": 0})
            row["excess_estimate"], row["excess_bound"] = est, bound
        return out

    def forget_idle(self) -> int:
        """Fold the decision counts that did not change since the last call into their
        series' totals and drop them. Returns how many were dropped, counting those that
        `forget_view` dropped since the last call.

        The hot path increments without a lock; an entry dropped while a thread is between
        reading and writing it comes back with its old count plus one, and that old count
        is counted twice. Only a tenant idle for a whole period and used again at that
        instant can hit this, and it can only add, never subtract.
        """
        with self._lock:
            d, dropped = self.decisions, 0
            for k, n in self._seen.items():
                if d.get(k) == n:
                    del d[k]
                    s = self._series(k[1], k[2])
                    self._forgotten[s] = self._forgotten.get(s, 0) + n
                    dropped += 1
                    row = self._limit_folded.setdefault((k[0], k[1]), [0, 0])
                    row[0 if s[2] == Reason.ADMITTED.value else 1] += n
            if dropped > max(len(d), 1024):
                # A dict keeps its largest table through deletions: rebuild it in place
                # (the hot path holds it). A count made between the copy and the update
                # may be lost; the exported counters never go down for it (_Labelled).
                keep = dict(d)
                d.clear()
                d.update(keep)
            self._seen = dict(d)
            live = {(t, m) for t, m, _ in d}
            for lk in [lk for lk in self._limit_folded if lk not in live]:
                del self._limit_folded[lk]  # idle: its counts start again from 0
            dropped, self._folded = dropped + self._folded, 0
            return dropped

    def forget_view(self, tenant: str, metric: str, gate: Gate) -> None:
        """The core forgot `tenant`'s view of `metric` (idle): fold the decisions counted
        under its current verdicts into their series' totals now, rather than at the next
        `forget_idle`, so that their keys (and the tenant's name) do not outlive the view by
        a whole period. Under 250,000 one-off tenants those keys were most of what stayed
        in memory at the peak, and what pinned the allocator's arenas afterwards (issue
        12). Counts under a verdict the view no longer hands out wait for `forget_idle`.
        Called on the node's loop, under its lock; the same race as `forget_idle`."""
        d = self.decisions
        with self._lock:
            for v in (gate.ok, gate.no):
                k = (tenant, metric, id(v))
                n = d.pop(k, None)
                if n is not None:
                    self._seen.pop(k, None)
                    self._folded += 1
                    self._limit_folded.pop((tenant, metric), None)
                    s = self._series(metric, id(v))
                    self._forgotten[s] = self._forgotten.get(s, 0) + n

    def _series(self, metric: str, vid: int) -> Series:
        v = self.verdicts[vid]
        if (
            v.reason is Reason.POLICY_UNKNOWN
            and self._metric_declared is not None
            and not self._metric_declared(metric)
        ):
            metric = OTHER  # a name no policy declares is never a label value
        return (
            metric,
            v.mode.value if v.mode else "none",
            v.reason.value,
            v.suspended.value if v.suspended else "",
        )


class _Labelled(Generic[S]):
    """Counters by (tenant label, series) where the labelled tenants change between scrapes
    (module docstring): monotonic per label, and their sum is the source's total."""

    def __init__(self) -> None:
        self._top: set[str] = set()
        self._base: dict[tuple[str, S], int] = {}  # the source's count at the last update
        self._out: dict[tuple[str, S], int] = {}  # exported, labelled tenants only
        self._other: dict[S, int] = {}

    def update(
        self,
        top: set[str],
        per_tenant: dict[tuple[str, S], int],
        totals: dict[S, int],
        net: set[S] | frozenset[S] = frozenset(),
    ) -> list[tuple[str, S, int]]:
        """`net`: the series whose source counts went down since the last update only by
        refunds (a net of usage), not by forgetting: a labelled count of theirs then keeps
        its highest, and counts again once past it (the highest net reached). For the other
        series, a lower count is a source forgotten and started again: counted from it."""
        base: dict[tuple[str, S], int] = {}
        out: dict[tuple[str, S], int] = {}
        for k, n in per_tenant.items():
            if k[0] not in top:
                continue
            prev = self._base.get(k)
            if prev is None:  # new to the top: its past stays in "other"
                prev = 0 if k[0] in self._top else n
            out[k] = self._out.get(k, 0) + max(0, n - prev)
            base[k] = max(n, prev) if k[1] in net else n
        for k, got in self._out.items():
            if k[0] in top and k not in out:  # its source count was forgotten meanwhile
                out[k], base[k] = got, 0
        self._top, self._base, self._out = set(top), base, out
        labelled: dict[S, int] = {}
        for (_, s), got in out.items():
            labelled[s] = labelled.get(s, 0) + got
        rows = [(t, s, n) for (t, s), n in out.items()]
        for s, total in totals.items():
            other = max(self._other.get(s, 0), total - labelled.get(s, 0))
            if other:
                self._other[s] = other
        rows.extend((OTHER, s, n) for s, n in self._other.items())
        return rows


def _top(k: int, score: dict[str, tuple[int, float, int]]) -> set[str]:
    best = heapq.nsmallest(k, score, key=lambda t: (-score[t][0], -score[t][1], -score[t][2], t))
    return set(best)


class _Collector(Collector):
    def __init__(self, tel: Telemetry, stats: Callable[[], NodeStats]) -> None:
        self.tel = tel
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        with self.tel._lock:
            ranked = self._rank(s)
        decided, applied = ranked.decided, ranked.applied
        yield from _decision_families(decided)
        units = CounterMetricFamily(
            "ratemesh_admitted_units",
            "Units (or bytes) admitted by this member per limit, net of refunds: counted "
            "as its reports go out (global, strict) and at its settles (local, share)",
            labels=["tenant", "metric", "mode"],
        )
        for t, (m, mode), n in sorted(ranked.units):
            units.add_metric([_label(t), m, mode], n)
        yield units
        fam = CounterMetricFamily(
            "ratemesh_owner_applied",
            "Usage applied by this member as owner (units or bytes)",
            labels=["tenant", "metric"],
        )
        for t, m, n in sorted(applied):
            fam.add_metric([_label(t), m], n)
        yield fam
        top = ranked.top
        active = GaugeMetricFamily(
            "ratemesh_active_reporters",
            "Active reporters of keys this member owns",
            labels=["tenant", "metric"],
        )
        for (t, m), r in sorted(_fold(top, s.active_reporters).items()):
            active.add_metric([_label(t), m], int(r))
        yield active
        est = GaugeMetricFamily(
            "ratemesh_excess_estimate",
            "Estimated fleet excess over the ideal limiter (units)",
            labels=["tenant", "metric"],
        )
        bound = GaugeMetricFamily(
            "ratemesh_excess_bound", "The envelope N*b + R*d (units)", labels=["tenant", "metric"]
        )
        ests = _fold(top, {k: e for k, (e, _) in s.excess.items()})
        bounds = _fold(top, {k: b for k, (_, b) in s.excess.items()})
        for k in sorted(ests):
            est.add_metric([_label(k[0]), k[1]], round(ests[k], 3))
            bound.add_metric([_label(k[0]), k[1]], round(bounds[k], 3))
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
        yield CounterMetricFamily(
            "ratemesh_owner_escrow_charged_units",
            "Units this member as owner charged to keys for silent members' floors",
            value=s.escrow_charged,
        )
        yield CounterMetricFamily(
            "ratemesh_owner_escrow_netted_units",
            "Of the escrow charged, units the silent members' later reports netted",
            value=s.escrow_netted,
        )
        yield CounterMetricFamily(
            "ratemesh_owner_escrow_refunded_units",
            "Of the escrow charged, units never reported and given back when it closed",
            value=s.escrow_refunded,
        )
        yield CounterMetricFamily(
            "ratemesh_peer_bad_replies",
            "Replies on this member's peer links that failed validation or were not a reply",
            value=s.peer_bad_replies,
        )
        yield CounterMetricFamily(
            "ratemesh_cell_tier_errors",
            "Calls to the spend quotas' shared cell tier that failed",
            value=s.cell_tier_errors,
        )
        yield CounterMetricFamily(
            "ratemesh_refused_stream_collections",
            "Young garbage collections run because peer streams were refused",
            value=s.refused_stream_collections,
        )
        refused = CounterMetricFamily(
            "ratemesh_peer_refused",
            "Peer streams refused or ended by this member, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(s.peer_refused.items()):
            refused.add_metric([reason], n)
        yield refused
        yield from self.tel.shadow.families(top)
        labelled = _named_labelled(s, top, self.tel.top_k)
        yield from _policy_families(s, labelled)
        yield from _limit_families(s, labelled, top, ranked.active, self.tel._policy_of)
        credit = CounterMetricFamily(
            "ratemesh_strict_credit_events",
            "The strict credit client's events (admitted, vetoed by the mesh, credit_denied, "
            "reserves, granted, refused, unreachable, returned, returns_dropped, ...)",
            labels=["event"],
        )
        for event, n in sorted(s.strict.items()):
            credit.add_metric([event], n)
        yield credit
        if s.redis_answered is not None:
            yield from _redis_families(s)

    def _rank(self, s: NodeStats) -> _Ranked:
        """Pick the top-K tenants and update the labelled counters (under the lock)."""
        tel = self.tel
        score: dict[str, tuple[int, float, int]] = {}  # denied, excess, admitted
        per_tenant: dict[tuple[str, Series], int] = {}
        totals = dict(tel._forgotten)
        active: set[tuple[str, str]] = set()  # (tenant, metric) with a decision under a policy
        for (tenant, metric, vid), n in list(tel.decisions.items()):
            series = tel._series(metric, vid)
            totals[series] = totals.get(series, 0) + n
            if series[2] == Reason.POLICY_UNKNOWN.value or tenant == OTHER:
                continue  # no known policy: never a label value
            active.add((tenant, metric))
            k = (tenant, series)
            per_tenant[k] = per_tenant.get(k, 0) + n
            d, e, a = score.get(tenant, (0, 0.0, 0))
            if series[2] == Reason.ADMITTED.value:
                score[tenant] = (d, e, a + n)
            else:
                score[tenant] = (d + n, e, a)
        for (tenant, _), (est, _) in s.excess.items():
            d, e, a = score.get(tenant, (0, 0.0, 0))
            score[tenant] = (d, e + est, a)
        units: dict[tuple[str, tuple[str, str]], int] = {}
        for (tenant, metric, mode), n in s.admitted_units.items():
            if tenant == OTHER:
                continue
            active.add((tenant, metric))
            units[(tenant, (metric, mode))] = n
            if tenant not in score:  # decisions not counted (count_decisions=False)
                score[tenant] = (0, 0.0, n)
        for tenant, _ in (*s.applied, *s.active_reporters):
            if tenant and tenant != OTHER and tenant not in score:
                score[tenant] = (0, 0.0, 0)
        top = _top(tel.top_k, score)
        decided = tel._decided.update(top, per_tenant, totals)
        by_metric: dict[str, int] = {}
        mine: dict[tuple[str, str], int] = {}
        retired: dict[str, int] = {}
        for (tenant, metric), n in s.applied.items():
            by_metric[metric] = by_metric.get(metric, 0) + n
            if tenant:
                mine[(tenant, metric)] = n
            else:  # "" is the owner's sum of forgotten and moved keys, per metric
                retired[metric] = n
        # A tenant's applied units go down when a refund is applied, or when one of its
        # keys is forgotten or moves (its units go to the per-metric sum): for a metric
        # whose sum did not grow, only the first, so its counters keep their highest net.
        net = {m for m in by_metric if retired.get(m, 0) == tel._retired.get(m, 0)}
        tel._retired = retired
        applied = [(t, m, n) for t, m, n in tel._applied.update(top, mine, by_metric, net)]
        admitted = tel._units.update(top, units, dict(s.admitted_units_totals))
        return _Ranked(top, decided, applied, admitted, active)


class _Ranked(NamedTuple):
    """One scrape's labelled tenants and the counters' rows for them (`_Collector._rank`)."""

    top: set[str]
    decided: list[tuple[str, Series, int]]
    applied: list[tuple[str, str, int]]
    units: list[tuple[str, tuple[str, str], int]]
    active: set[tuple[str, str]]  # (tenant, metric) pairs used here under a policy


def _fold(top: set[str], values: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """Gauges: the labelled tenants' own, the rest summed per metric under "other"."""
    out: dict[tuple[str, str], float] = {}
    for (tenant, metric), v in values.items():
        k = (tenant if tenant in top else OTHER, metric)
        out[k] = out.get(k, 0) + v
    return out


def _named_labelled(s: NodeStats, top: set[str], k: int) -> set[str]:
    """The tenants with a policy by name that get series of their own in the per-limit
    gauges: those of the other families' top-K, then, in the slots they leave free, the
    others by name (an idle tenant's limit is still worth seeing, and members pick the same
    ones), so that the page never holds more than K tenant labels and "other"."""
    tenants = sorted({t for t, _ in s.enforced if t != OTHER})
    labelled = {t for t in tenants if t in top}
    labelled.update([t for t in tenants if t not in labelled][: max(0, k - len(top))])
    return labelled


def _policy_families(s: NodeStats, labelled: set[str]) -> Iterator[Metric]:
    """The enforced generation per limit, and the policy file's reloads.

    Tenants labelled: `_named_labelled`. The rest go under "other" with the highest
    generation among them, per metric.
    """
    gens: dict[tuple[str, str], int] = {}
    for (tenant, metric), g in s.enforced.items():
        key = (tenant if tenant in labelled else OTHER, metric)
        gens[key] = max(gens.get(key, 0), g)
    fam = GaugeMetricFamily(
        "ratemesh_policy_generation",
        "The newest policy generation this member enforces, per limit (tenant=other: the "
        "highest among the tenants without a series of their own)",
        labels=["tenant", "metric"],
    )
    for key, g in sorted(gens.items()):
        fam.add_metric([_label(key[0]), key[1]], g)
    yield fam
    yield CounterMetricFamily(
        "ratemesh_policy_reloads",
        "Policy file reloads accepted (SIGHUP, a changed file, or the API)",
        value=s.policy_reloads,
    )
    refused = CounterMetricFamily(
        "ratemesh_policy_reloads_refused",
        "Policy file reloads refused, nothing changed (invalid: unreadable or not valid; "
        "conflict: a known generation given different values)",
        labels=["reason"],
    )
    for reason, n in sorted(s.policy_reloads_refused.items()):
        refused.add_metric([reason], n)
    yield refused


def _limit_families(
    s: NodeStats,
    labelled: set[str],
    top: set[str],
    active: set[tuple[str, str]],
    policy_of: Callable[[str, str], TenantRatePolicy | None] | None,
) -> Iterator[Metric]:
    """Each limit's R and B as gauges, so that a rule can set a limit's admitted units
    (summed over members) beside its rate. Series of their own: the tenants with a policy
    by name that are labelled (`_named_labelled`), and the top-K tenants that use a limit
    here under a default policy (resolved by `policy_of`). tenant="other": per metric, the
    largest R and the largest B among the rest, the default policies' always among them
    (every tenant without a series of its own may spend under one)."""
    numbers: dict[tuple[str, str], tuple[float, float]] = {}
    for (tenant, metric), (r, b) in s.limits.items():
        keys = [(tenant, metric)] if tenant in labelled else []
        if tenant not in labelled or _is_default(tenant):
            keys.append((OTHER, metric))
        for key in keys:
            r0, b0 = numbers.get(key, (0.0, 0.0))
            numbers[key] = (max(r0, r), max(b0, b))
    if policy_of is not None:
        for tenant, metric in sorted(active):
            if (tenant not in top and tenant not in labelled) or (tenant, metric) in numbers:
                continue
            p = policy_of(tenant, metric)
            rb = None if p is None else rate_and_burst(p)
            if rb is not None:
                numbers[(tenant, metric)] = rb
    rate = GaugeMetricFamily(
        "ratemesh_limit_rate",
        "The limit's rate R in units (or bytes) per second (tenant=other: the largest "
        "among the limits without a series of their own)",
        labels=["tenant", "metric"],
    )
    burst = GaugeMetricFamily(
        "ratemesh_limit_burst",
        "The limit's burst B in units (or bytes) (tenant=other: the largest among the "
        "limits without a series of their own)",
        labels=["tenant", "metric"],
    )
    for (tenant, metric), (r, b) in sorted(numbers.items()):
        rate.add_metric([_label(tenant), metric], r)
        burst.add_metric([_label(tenant), metric], b)
    yield rate
    yield burst


def _is_default(tenant: str) -> bool:
    """A default policy's scope ("*", or a descriptor default): it applies to tenants
    that have no policy by name."""
    base, desc = split_tenant(tenant)
    return base == DEFAULT_TENANT or (desc is not None and desc[1] == DESCRIPTOR_WILDCARD)


def _redis_families(s: NodeStats) -> Iterator[Metric]:
    """Redis mode's tier: a fixed set of causes, never a key or a tenant."""
    yield CounterMetricFamily(
        "ratemesh_redis_answered",
        "Redis-mode decisions the shared counter made",
        value=s.redis_answered or 0,
    )
    fam = CounterMetricFamily(
        "ratemesh_redis_fallbacks",
        "Redis-mode decisions the embedded limiter made instead (suspended "
        "redis_unreachable), by cause",
        labels=["cause"],
    )
    for cause, n in sorted(s.redis_fallbacks.items()):
        fam.add_metric([cause], n)
    yield fam
    yield GaugeMetricFamily(
        "ratemesh_redis_breaker_open",
        "1 while the redis tier's circuit breaker is open or half-open",
        value=s.redis_breaker_open,
    )


def _decision_families(rows: list[tuple[str, Series, int]]) -> Iterator[Metric]:
    lab = ["tenant", "metric", "mode", "reason"]
    admitted = CounterMetricFamily("ratemesh_admitted", "Local decisions that admitted", labels=lab)
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
    susp_sum: dict[tuple[str, str, str, str], int] = {}
    for t, (metric, mode, reason, susp), n in sorted(rows):
        fam = admitted if reason == Reason.ADMITTED.value else denied
        fam.add_metric([_label(t), metric, mode, reason], n)
        if reason in _STALE:
            stale.add_metric([_label(t), metric, mode, reason], n)
        if susp:
            sk = (_label(t), metric, mode, susp)
            susp_sum[sk] = susp_sum.get(sk, 0) + n
    for sk, n in sorted(susp_sum.items()):
        suspended.add_metric(list(sk), n)
    yield from (admitted, denied, stale, suspended)


def _label(tenant: str) -> str:
    """A tenant label value: a descriptor's own key as `tenant[key=value]` (the operator's
    form, as in CLI messages), not its encoded tenant part."""
    base, sep, desc = tenant.partition(DESCRIPTOR_SEP)
    return f"{base}[{desc}]" if sep else tenant

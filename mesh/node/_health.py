"""What a node says about itself: /health JSON, `mesh status`, and the scrape-time stats.

Built under the node's lock from the Member's state; nothing here is on the hot path.
"""

from __future__ import annotations

import json
from typing import Any

from mesh.core.member import Member
from mesh.core.policy import BOUNDS, Mode, TenantRatePolicy
from mesh.core.reporter import excess_estimate
from mesh.node._capability import capability
from mesh.node._driver import NodeDriver
from mesh.node._meters import meters
from mesh.node._watch import DependencyWatch
from mesh.telemetry import Detail, NodeStats, Route, rate_and_burst
from ratemesh import envelope
from ratemesh.policy import RateKey, split_tenant

__all__ = [
    "health",
    "status",
    "node_stats",
    "d_estimate_ns",
    "enforced",
    "redis_health",
    "ENFORCED_SHOWN_MAX",
    "probe_routes",
]

# Limits listed in `policies.enforced` (and so in a Status answer, which `mesh status --fleet`
# compares across members); past it the rest are counted in `enforced_omitted`.
ENFORCED_SHOWN_MAX = 10_000


def enforced(driver: NodeDriver) -> dict[tuple[str, str], int]:
    """(tenant, metric) -> the newest generation this node enforces: its cache's current
    one, which admission adopts at its next tick (within one sync interval)."""
    with driver.lock:
        return {(p.tenant_id, p.metric): p.generation for p in driver.member.policies}


def d_estimate_ns(driver: NodeDriver) -> int:
    """d for the envelope from this node's recent report-to-acknowledgement delays and its
    sync tick's worst recent lateness, as `ratemesh.envelope.d_estimate_ns` defines it (one
    definition: /health, the demo, the benchmarks and the simulator)."""
    lags = driver.delays.recent_tick_lags_ns
    core = driver.config.core
    return envelope.d_estimate_ns(
        driver.recent_delays_ns,
        core.sync_interval_ns,
        max(lags, default=0),
        horizon_ns=core.owner_unreachable_ns,
    )


def node_stats(driver: NodeDriver) -> NodeStats:
    m = driver.member
    now = driver.clock_ns()
    port = driver.transport.stats()
    s = NodeStats(
        members=len(m.ring),
        ring_epoch=m.ring.epoch,
        membership_stale=driver.membership_view.stale,
        messages_sent=driver.messages_sent,
        escrow_charged=m.owner.escrows.charged_units,
        escrow_netted=m.owner.escrows.netted_units,
        escrow_refunded=m.owner.escrows.refunded_units,
        peer_refused=dict(port.get("refused", {})),
        peer_bad_replies=port.get("bad_replies", 0),
        cell_tier_errors=driver.tier_errors,
        refused_stream_collections=driver.refused_collections,
        enforced=enforced(driver),
        strict={} if driver.credit is None else driver.credit.stats(),
    )
    desk = m.admission.redis
    if desk is not None:
        with driver.lock:
            s.redis_answered = desk.answered
            s.redis_fallbacks = {c.value: n for c, n in desk.fallbacks.items()}
            s.redis_breaker_open = int(desk.breaker.state.value != "closed")
    if driver.reloader is not None:
        s.policy_reloads = driver.reloader.stats.ok
        s.policy_reloads_refused = dict(driver.reloader.stats.refused)
    with driver.lock:
        s.applied = m.owner.applied_by_scope()  # per tenant/metric, across generations
        s.admitted_units = driver.units.by_limit()
        s.admitted_units_totals = driver.units.totals()
        for p in m.policies:  # R and B of each policy by name (`rate_and_burst`)
            numbers = rate_and_burst(p)
            if numbers is not None:
                s.limits[(p.tenant_id, p.metric)] = numbers
        for key, ks in list(m.owner.keys.items()):
            scope = (key.tenant_id, key.metric)
            n = sum(1 for rs in ks.reporters.values() if rs.lease_until_ns >= now)
            s.active_reporters[scope] = max(s.active_reporters.get(scope, 0), n)
        views = list(m.reporter.gates.values())
    d_ns = d_estimate_ns(driver)
    n_live = len(m.ring)
    for v in views:
        p = v.policy
        est, bound = excess_estimate(v, n_live, d_ns)
        # Both in sub-units (`TenantRatePolicy.scale`): reported in units.
        s.excess[(p.tenant_id, p.metric)] = (round(est / p.scale, 3), round(bound / p.scale, 3))
    return s


def health(driver: NodeDriver) -> dict[str, Any]:
    m = driver.member
    mv = driver.membership_view
    limits = []
    suspended = []
    listed: set[tuple[str, str, str]] = set()  # (tenant part, metric, reason) in `suspended`
    with driver.lock:
        views = {(v.policy.tenant_id, v.policy.metric): v for v in m.admission.gates()}
        policies = list(m.policies)
        # each policy's view's own state (`Gate.health`: credit held, a global view's
        # state), read under the lock
        own = {k: views[k].health() for p in policies if (k := (p.tenant_id, p.metric)) in views}
        quotas = None if m.quotas is None else m.quotas.health(ENFORCED_SHOWN_MAX)
        wd = m.admission.would_deny
        shadow = driver.telemetry.shadow.health(wd)
        shadowed = {
            (p.tenant_id, p.metric): wd.of(p.tenant_id, p.metric) for p in policies if p.shadow
        }
    shown_meters, meters_omitted = meters(driver)
    d_ns = d_estimate_ns(driver)
    for p in policies:
        v = views.get((p.tenant_id, p.metric))
        bound = v.no.bound if v is not None else BOUNDS[p.mode.value]
        susp = v.no.suspended.value if v is not None and v.no.suspended else None
        if p.mode is Mode.SHARE and mv.stale:
            bound, susp = BOUNDS["share_stale"], "membership_stale"
        entry: dict[str, Any] = {
            **_who(p.tenant_id),
            "metric": p.metric,
            "generation": p.generation,
            "mode": p.mode.value,
            "bound": bound,
            "suspended": susp,
        }
        # As written (a rate not whole per second as text, its bursts in units; to_dict).
        written = p.to_dict()
        for name in ("target_rate", "global_burst", "local_burst_cap"):
            entry[name] = written.get(name, 0)  # a quota policy may write no rate
        if p.quota is not None:  # a spend quota (docs/quotas.md)
            entry["period"], entry["quota"] = written["period"], written["quota"]
        if p.mode is Mode.GLOBAL:
            units = envelope.excess_bound(len(m.ring), p.local_burst_cap, p.target_rate, d_ns)
            entry["envelope"] = round(units / p.scale, 3)
        entry.update(own.get((p.tenant_id, p.metric), {}))
        if p.shadow:  # evaluated and counted, never enforced (docs/policies.md)
            entry["posture"] = p.posture.value
            entry["would_deny"] = shadowed[(p.tenant_id, p.metric)]._asdict()
        limits.append(entry)
        if susp:
            listed.add((p.tenant_id, p.metric, susp))
            suspended.append(
                {**_who(p.tenant_id), "metric": p.metric, "reason": susp, **_owner(m, p)}
            )
    # Views opened for tenants under a default ("*") policy carry their own suspensions.
    for (tenant, metric), v in sorted(views.items(), key=_first):
        if tenant != v.policy.tenant_id or v.no.suspended is None:
            continue
        reason = v.no.suspended.value
        if (tenant, metric, reason) not in listed:  # a set: 10,000 suspended views are common
            listed.add((tenant, metric, reason))
            suspended.append(
                {**_who(tenant), "metric": metric, "reason": reason, **_owner(m, v.policy, tenant)}
            )
    feed = driver.feed
    redis = redis_health(driver)
    shown = [
        {**_who(p.tenant_id), "metric": p.metric, "generation": p.generation}
        for p in policies[:ENFORCED_SHOWN_MAX]
    ]
    watch = driver.watch
    return {
        "member_id": driver.member_id,
        "identity": {"source": driver.identity.source, "stable": driver.identity.stable},
        "worker_epoch": m.reporter.worker_epoch,
        "status": "closing" if driver.closing else "serving",
        # why /health/ready answers 503 ([] when ready), and each dependency failing or not
        # heard from yet (docs/telemetry.md: ratemesh_dependency_up)
        "ready": watch is not None and not watch.ready_reasons(),
        "not_ready": [] if watch is None else watch.ready_reasons(),
        "degraded": [] if watch is None else watch.deps.degraded(),
        "dependencies": {} if watch is None else watch.deps.health(),
        "membership": {
            "N": len(m.ring),
            "epoch": m.ring.epoch,
            "stale": mv.stale,
            "members": list(m.ring.members),
        },
        "d_ms": round(d_ns / 1e6, 3),
        # The longest the sync tick ran late since the start (a busy loop or CPU): a view
        # expires only when its tick runs, so its staleness can exceed d by this much.
        "tick_lag_max_ms": round(driver.tick_lag_max_s * 1000, 3),
        "limits": limits,
        "suspended": suspended,
        # spend quotas' convergence (docs/quotas.md): per quota cap, own, remote, lag_ms
        "quotas": quotas,
        # limits in shadow posture: what they admitted and would have denied, per tenant
        "shadow": shadow,
        # per tenant, what this member's limits took from its traffic (mesh policy preview)
        "meters": shown_meters,
        "meters_omitted": meters_omitted,
        # in-flight caps (docs/policies.md): this worker's slots and the scopes it owns
        "concurrency": m.slots.health(),
        "policies": {
            "count": len(policies),
            "enforced": shown,  # per limit, the generation enforced (sorted by limit)
            "enforced_omitted": len(policies) - len(shown),
            "reload": None if driver.reloader is None else driver.reloader.health(),
            "coordinator": None
            if feed is None
            else {
                "revision": feed.revision,
                "watching": feed.watching,
                "reachable": feed.reachable,
                "last_error": feed.last_error,
                "conflicts": feed.conflicts,  # generations refused: other values than known
            },
        },
        "owner": {
            "keys": len(m.owner.keys),
            "applied_units": m.owner.applied_units,
            "duplicates": m.owner.duplicates,
            # units charged for silent members' floors, and netted by their later reports
            "escrow_charged_units": m.owner.escrows.charged_units,
            "escrow_netted_units": m.owner.escrows.netted_units,
            "escrow_refunded_units": m.owner.escrows.refunded_units,
            "handovers": m.owner.handovers.stats(),
            "refused": dict(m.owner.refused),  # peers' reports refused, by reason
        },
        "reporter": {
            "views": len(m.reporter.gates),
            "reports_sent": m.reporter.reports_sent,
            "snapshots_taken": m.reporter.snapshots_taken,
        },
        "peer": driver.transport.stats(),
        # strict limits' credit (None without a `strict:` section): units admitted, vetoed
        # by the mesh first, denied by credit; reserves, grants, refusals, returns
        "redis": redis,
        # the fleet's 429 cooldown (docs/cooldown.md): limits cooling here, 429s reported
        # here, owners' notices taken, keys this member owns a cooldown for, refusals
        "cooldown": {
            "cooling": len(m.admission.cooldowns),
            "cooling_refused": m.admission.cooldowns_refused,
            "reported": m.cooldown.reported,
            "noticed": m.cooldown.noticed,
            "owned": len(m.cooldown.until),
            "refused": dict(sorted(m.cooldown.refused.items())),
        },
        # seed 002's capability block: tiers, modes and their bounds, convergence, suspensions
        "capability": capability(driver, policies, suspended, quotas, redis),
        "strict": None
        if driver.credit is None
        else {"governord": driver.credit.config.governord, **driver.credit.stats()},
        "bounds": {  # what the named bounds on the node's work did
            "reports_sliced": driver.reports_sliced,
            "reports_shed": driver.reports_shed,
            "reports_deduplicated": driver.reports_deduplicated,  # resends already queued
            "rows_deduplicated": driver.rows_deduplicated,
            "deliver_hold_max_ms": round(driver.deliver_hold_max_ns / 1e6, 3),
            "policy_fetches": len(m.owner._fetching),
            "fetch_polls": driver.fetch_polls,
            # a graceful leave's hand-over: keys held, and not on the wire within the drain
            "handover_keys": driver.handover_keys,
            "handover_keys_late": driver.handover_keys_late,
        },
    }


def probe_routes(watch: DependencyWatch) -> dict[str, Route]:
    """GET /health/live (200 while the process answers) and /health/ready (200 once the node
    has policies and a configured coordinator has answered, until it starts closing; else
    503 and why): the probes governord serves too, with no tenant in them."""

    def live() -> tuple[int, str, bytes]:
        return 200, "application/json", b'{"live":true}'

    def ready() -> tuple[int, str, bytes]:
        reasons = watch.ready_reasons()
        doc = {"ready": not reasons, "not_ready": reasons, "degraded": watch.deps.degraded()}
        return (503 if reasons else 200), "application/json", json.dumps(doc).encode()

    def ready_public() -> tuple[int, str, bytes]:  # reasons name members and addresses
        ok = not watch.ready_reasons()
        return (200 if ok else 503), "application/json", json.dumps({"ready": ok}).encode()

    return {"/health/live": live, "/health/ready": Detail(ready, ready_public)}


def redis_health(driver: NodeDriver) -> dict[str, Any]:
    """What redis mode knows (docs/redis.md): whether a tier is configured and where, the
    breaker, round trips and Redis's decisions, and the embedded limiter's answers by cause
    (the verdicts' suspension stays redis_unreachable for all of them), the last error."""
    counter, desk = driver.redis, driver.member.admission.redis
    if counter is None or desk is None:
        return {"configured": False, "addr": None}
    with driver.lock:
        known = desk.health()
    return {"configured": True, "addr": getattr(counter, "addr", None), **known}


def status(driver: NodeDriver) -> dict[str, Any]:
    """The Status call's answer: /health plus the ring members' addresses, which
    `mesh status --fleet` dials (not on /health: the telemetry port asks for no proof)."""
    out = health(driver)
    out["membership"]["addresses"] = dict(sorted(driver.membership_view.members.items()))
    return out


def _first(item: tuple[Any, Any]) -> Any:
    return item[0]


def _owner(m: Member, p: TenantRatePolicy, tenant: str | None = None) -> dict[str, str]:
    """`owner`: the member that meters a suspended limit's key (global and strict modes;
    the others have none), so that the page can say whom `owner_unreachable` waits on."""
    if p.mode not in (Mode.GLOBAL, Mode.STRICT) or not len(m.ring):
        return {}
    key = RateKey(tenant or p.tenant_id, p.metric, p.generation)
    return {"owner": m.ring.owner_of(key)}


def _who(tenant_id: str) -> dict[str, str]:
    """A RateKey's tenant part as /health shows it: `tenant`, and `descriptor`
    ("key=value") for a descriptor's own key, rather than the encoded part."""
    tenant, desc = split_tenant(tenant_id)
    if desc is None:
        return {"tenant": tenant}
    return {"tenant": tenant, "descriptor": f"{desc[0]}={desc[1]}"}

"""/health's capability block (seed 002): which shared-state tiers this node is configured
with, the modes its limits use and the bound each discloses, what converges and how far
behind it is, and the suspensions in force, in one place an SRE can read at a glance.

Built from what the node already knows (config, /health's limits, the quota ledger, the
redis desk); nothing here dials anything. A node with no tier says so in its own words, as
seed 002's single node does.
"""

from __future__ import annotations

from typing import Any

from mesh.core.policy import BOUNDS, Mode, TenantRatePolicy
from mesh.node._driver import NodeDriver

__all__ = ["capability", "CONVERGES"]

# What each mode makes fleet-wide, and which way its remaining error runs (seed 002's table,
# in this project's modes; docs/redis.md, docs/quotas.md, docs/strict.md).
CONVERGES: dict[str, dict[str, str]] = {
    "local": {"how": "not fleet-wide: each process alone", "error": "fleet<=N*limit"},
    "share": {
        "how": "each member enforces ceil(limit/N_live) from membership",
        "error": "over-admits by up to N-1 from rounding; N decays to 1 when membership is stale",
    },
    "global": {
        "how": "owner GCRA over the members' usage reports, snapshots back within d",
        "error": "over-admits by at most N*b+R*d",
    },
    "redis": {
        "how": "one atomic GCRA script step per admission on the shared Redis",
        "error": "exact while Redis answers; up to N*limit while it does not",
    },
    "strict": {
        "how": "governord credit blocks, the mesh vetoing first",
        "error": "never over R*(t1-t0)+B; fails closed when governord does not answer",
    },
    "quota": {
        "how": "per-worker cells of cumulative burn, folded by owners (and the Redis tier)",
        "error": "over-admits by what peers burned since their last publish",
    },
}


def _kind(p: TenantRatePolicy) -> str:
    return "quota" if p.quota is not None else p.mode.value


def capability(
    driver: NodeDriver,
    policies: list[TenantRatePolicy],
    suspended: list[dict[str, Any]],
    quotas: dict[str, Any] | None,
    redis: dict[str, Any],
) -> dict[str, Any]:
    cfg = driver.config
    m = driver.member
    tiers: list[dict[str, Any]] = []
    membership = cfg.membership.source if cfg.membership is not None else "static"
    tiers.append(
        {
            "tier": "mesh",
            "members": len(m.ring),
            "membership": membership,
            "stale": driver.membership_view.stale,
        }
    )
    redis_cfg = cfg.shared_state.redis
    if redis_cfg is not None:
        tiers.append(
            {
                "tier": "redis",
                "addr": redis_cfg.addr,
                "tls": redis_cfg.tls,
                "serves": ["redis mode", "spend quota cells"],
                "breaker": redis.get("breaker"),
            }
        )
    pg_cfg = cfg.shared_state.postgres
    if pg_cfg is not None:  # the DSN is never shown: it may carry a password
        tiers.append({"tier": "postgres", "schema": pg_cfg.schema, "serves": ["spend quota cells"]})
    if cfg.strict is not None:
        tiers.append({"tier": "governord", "addr": cfg.strict.governord, "serves": ["strict"]})
    if cfg.coordinator is not None:
        tiers.append({"tier": "coordinator", "addr": cfg.coordinator.addr, "serves": ["policies"]})
    counts: dict[str, int] = {}
    for p in policies:
        k = _kind(p)
        counts[k] = counts.get(k, 0) + 1
    modes = {
        k: {"limits": n, "bound": BOUNDS[k], **CONVERGES[k]}
        for k, n in sorted(counts.items())
        if k in CONVERGES
    }
    rows = [] if quotas is None else quotas.get("quotas", [])
    lags = [r["lag_ms"] for r in rows if r.get("lag_ms") is not None]
    convergence = {
        "quotas": len(rows),
        "lag_ms_max": max(lags) if lags else None,
        "publish_ms": None if quotas is None else quotas.get("publish_ms"),
        "retention_ms": None if quotas is None else quotas.get("retention_ms"),
        "redis_tier": redis_cfg is not None,
        "postgres_tier": pg_cfg is not None,
    }
    alone = redis_cfg is None and pg_cfg is None and len(m.ring) <= 1 and cfg.strict is None
    reasons: dict[str, int] = {}
    for s in suspended:
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    out: dict[str, Any] = {
        "kind": "ratemesh/distributed-health",
        "shared_state_enabled": redis_cfg is not None or pg_cfg is not None,
        "tiers": tiers,
        "modes": modes,
        "convergence": convergence,
        "suspensions": dict(sorted(reasons.items())),
    }
    if alone:
        out["note"] = (
            "single node: no shared-state tier, no peers and no governord configured; "
            "global and share limits meter this process alone, redis limits run on the "
            "embedded limiter (suspended redis_unreachable) and strict limits fail closed"
        )
    if any(p.mode is Mode.REDIS for p in policies) and redis_cfg is None:
        out["warning"] = (
            "redis limits without shared_state.redis: each process enforces the full limit "
            "alone (fleet<=N*limit), disclosed as redis_unreachable"
        )
    return out

"""The bound each coordination mode discloses. The metrics, units and modes themselves are
the shared policy model's (`ratemesh.policy`), re-exported here for the mesh's imports."""

from __future__ import annotations

from ratemesh.policy import Metric, Mode, Unit

__all__ = ["Metric", "Unit", "Mode", "BOUNDS"]

# Fixed, machine-readable bound strings: shown on /health and carried by every verdict.
BOUNDS: dict[str, str] = {
    "local": "fleet<=N*limit",
    "share": "fleet<=N*ceil(limit/N_live)",
    "share_stale": "membership_stale:N=1;fleet<=N*limit",
    "global": "excess<=N*b+R*d",
    "global_stale": "excess<=N*b+R*d;stale_view_restricted",
    # Cut off from the owner: the view spends only its floor, R/members for a bounded span,
    # escrowed by the owner (docs/partitions.md).
    "global_floor": "excess<=N*b+R*d;owner_unreachable=>floor_R/N_escrowed",
    # Credit blocks from governord, the mesh's global view vetoing first (docs/strict.md).
    "strict": "admitted<=R*(t1-t0)+B;governor_unreachable=>fail_closed",
    # One GCRA script step against a shared Redis per admission, exact while it answers;
    # while it does not, each process's embedded limiter answers alone (docs/redis.md).
    "redis": "exact;redis_unreachable=>fleet<=N*limit",
    "redis_unreachable": "redis_unreachable:fleet<=N*limit",
    # Spend quotas (docs/quotas.md): own + remote against the cap, remote folded from the
    # peers' published cells; what peers burned since their last publish is not folded yet.
    "quota": "quota<=cap+peer_burn_since_last_fold",
    # No fold has reached this worker for the key yet: it spends at most cap/N_live alone.
    "quota_unfolded": "quota<=cap+peer_burn;unfolded:own<=cap/N_live",
    # The worker's quota ledger is at its bound (QUOTA_KEYS_MAX): a new quota key fails closed.
    "quota_full": "quota_keys_full:fail_closed",
    # A quota policy where no ledger is attached (an Admission built without a QuotaDesk).
    "quota_unattached": "quota:no_ledger:fail_closed",
    # A 429 from the service behind the limit, reported by a worker and spread by the key's
    # owner (docs/cooldown.md): nothing is admitted until the cooldown ends.
    "cooldown": "cooldown:nothing_admitted_until_it_ends",
    # A concurrency limit asked through try_admit: its slots are taken with acquire/release.
    "concurrency": "concurrency:acquire_a_slot",
    "disabled": "unlimited:policy_disabled",
    "unknown": "policy_unknown:fail_closed",
}

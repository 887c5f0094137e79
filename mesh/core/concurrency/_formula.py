"""The in-flight cap's arithmetic, in one place: each mode's per-worker cap, the global
mode's grant, and the bound every mode discloses.

`local`: each worker caps its own gauge at C (fleet <= N x C). `share`: each worker caps it
at ceil(C / N_live), the share formula of `mesh.core.shares` (fleet <= N x ceil(C/N_live)).
`global`: the key's owner grants each worker an allowance of slots out of what the fleet's
counted holdings leave free, at most b (`local_burst_cap`) to one worker; the fleet's
in-flight total stays <= C + N x b, the N x b term being what members cut off from the owner
(dropped after the member TTL while alive) or still reporting to a previous owner may hold.
"""

from __future__ import annotations

from mesh.core.shares import share_of
from ratemesh.policy import Mode, TenantRatePolicy

__all__ = [
    "CONCURRENCY_BOUNDS",
    "SHARE_STALE_BOUND",
    "global_excess",
    "grant_size",
    "slot_cap",
]

# Fixed, machine-readable bound strings, carried by every slot verdict and shown in the
# docs; `global_excess` computes the global one's N*b for the current fleet.
CONCURRENCY_BOUNDS: dict[Mode, str] = {
    Mode.LOCAL: "in_flight<=N*C",
    Mode.SHARE: "in_flight<=N*ceil(C/N_live)",
    Mode.GLOBAL: "in_flight<=C+N*b",
}
# share with membership stale: N decays to 1, each worker caps at C, as rate shares do.
SHARE_STALE_BOUND = "membership_stale:N=1;in_flight<=N*C"


def slot_cap(policy: TenantRatePolicy, n_live: int, allowance: int) -> int:
    """What one worker may hold in flight under `policy`: C (local), ceil(C / N_live)
    (share), or the allowance its owner granted (global)."""
    c = policy.concurrency
    assert c is not None, "slot_cap takes a concurrency policy"
    if policy.mode is Mode.LOCAL:
        return c
    if policy.mode is Mode.SHARE:
        return share_of(c, n_live)
    return allowance


def grant_size(cap: int, b: int, counted_others: int, want: int) -> int:
    """The allowance an owner grants one worker: what it asks for, at most b, and at most
    what the other members' counted holdings leave of C (never negative)."""
    return max(0, min(want, b, cap - counted_others))


def global_excess(n_members: int, b: int) -> int:
    """N x b: the most the fleet's in-flight total may pass C in global mode."""
    return max(1, n_members) * b

"""A worker's excess estimate for one global view, beside the envelope it discloses.

One formula, one place: the node exports it (`ratemesh_excess_estimate` and
`ratemesh_excess_bound`, docs/telemetry.md) and the tests hold the core to it.
"""

from __future__ import annotations

from mesh.core.gcra import NS_PER_S
from mesh.core.reporter._gate import GlobalGate
from ratemesh.envelope import excess_bound

__all__ = ["excess_estimate"]


def excess_estimate(v: GlobalGate, n_live: int, d_ns: int) -> tuple[float, float]:
    """(estimate, bound) in the view's sub-units (`TenantRatePolicy.scale`); the bound is
    the envelope N*b + R*d (`ratemesh.envelope.excess_bound`).

    This worker's use its owner has not applied (unacknowledged, and acknowledged but not
    applied: `GlobalGate.unapplied`), as if every other member ran as far ahead (at most b
    each), plus what the owner admits while reports are in flight. Its own is not capped:
    a worker whose usage is not reaching its owner's meter (reports lost, a stream down,
    reports taken for duplicates) shows all it admitted unheard, and can pass the bound.
    """
    p = v.policy
    b = p.local_burst_cap
    rd = p.target_rate * d_ns / NS_PER_S
    ahead = (v.unacked if v.unacked > 0 else 0) + v.unapplied
    est = ahead + (n_live - 1) * min(ahead, b) + rd
    return est, excess_bound(n_live, b, p.target_rate, d_ns)

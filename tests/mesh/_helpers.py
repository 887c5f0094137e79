"""Small builders shared by the mesh tests."""

from __future__ import annotations

from typing import Any

from mesh.core.config import MS
from mesh.core.policy import Metric, PolicyCache, RateKey, TenantRatePolicy
from mesh.core.ring import Ring

__all__ = ["MS", "policy", "cache", "owned_keys", "owned_policies"]


def policy(
    tenant: str = "t",
    *,
    rate: int = 1000,
    burst: int = 100,
    b: int = 20,
    mode: str = "global",
    metric: str = "read_iops",
    gen: int = 1,
    enabled: bool = True,
) -> TenantRatePolicy:
    return TenantRatePolicy(tenant, metric, gen, rate, burst, b, enabled, mode)  # type: ignore[arg-type]


def cache(*policies: TenantRatePolicy) -> PolicyCache:
    return PolicyCache(policies)


def owned_policies(
    ring: Ring, member: str, n: int, prefix: str = "t", **kw: Any
) -> list[TenantRatePolicy]:
    """`n` policies (tenants `prefix0`, `prefix1`, ... that `member` owns in `ring`), so
    an owner's tests can report from workers that are members of its ring."""
    out: list[TenantRatePolicy] = []
    i = 0
    while len(out) < n:
        p = policy(f"{prefix}{i}", **kw)
        if ring.owner_of(p.rate_key) == member:
            out.append(p)
        i += 1
    return out


def owned_keys(ring: Ring, member: str, n: int, prefix: str = "k") -> list[RateKey]:
    """`n` read_iops keys (tenants `prefix0`, `prefix1`, ... of generation 1) that `member`
    owns in `ring`."""
    out: list[RateKey] = []
    i = 0
    while len(out) < n:
        key = RateKey(f"{prefix}{i}", Metric.READ_IOPS, 1)
        if ring.owner_of(key) == member:
            out.append(key)
        i += 1
    return out

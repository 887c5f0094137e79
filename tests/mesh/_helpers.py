"""Small builders shared by the mesh tests."""

from __future__ import annotations

from mesh.core.config import MS
from mesh.core.policy import Metric, PolicyCache, TenantRatePolicy

__all__ = ["MS", "policy", "cache"]


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
    return TenantRatePolicy(tenant, Metric(metric), gen, rate, burst, b, enabled, mode)  # type: ignore[arg-type]


def cache(*policies: TenantRatePolicy) -> PolicyCache:
    return PolicyCache(policies)

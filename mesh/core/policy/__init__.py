"""Tenant rate policies, their generations, and the worker's local cache of them.

The model itself is `ratemesh.policy`, shared with governord (one policy model for both
planes); it is re-exported here so the mesh imports it from one place."""

from mesh.core.policy._cache import PolicyCache
from mesh.core.policy._metric import BOUNDS, Metric, Mode, Unit
from ratemesh.policy import DEFAULT_TENANT, RateKey, TenantRatePolicy

__all__ = [
    "BOUNDS",
    "DEFAULT_TENANT",
    "Metric",
    "Mode",
    "PolicyCache",
    "RateKey",
    "TenantRatePolicy",
    "Unit",
]

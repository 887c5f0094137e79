"""Tenant rate policies, their generations, and the worker's local cache of them."""

from mesh.core.policy._cache import PolicyCache
from mesh.core.policy._metric import BOUNDS, Metric, Mode, Unit
from mesh.core.policy._policy import DEFAULT_TENANT, RateKey, TenantRatePolicy

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

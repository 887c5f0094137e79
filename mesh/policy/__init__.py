"""Tenant rate policies, their generations, and the worker's local cache of them."""

from mesh.policy._cache import PolicyCache
from mesh.policy._metric import BOUNDS, Metric, Mode, Unit
from mesh.policy._policy import DEFAULT_TENANT, RateKey, TenantRatePolicy

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

"""A worker's local, versioned policy cache.

Admission never reads the coordinator: it reads this. A generation is immutable once known
(a changed limit is a new generation, so a RateKey never changes meaning), and a tenant with
no known policy is `policy_unknown`, never a permissive default.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from mesh.core.policy._metric import Metric
from mesh.errors import ConfigError
from ratemesh.policy import DEFAULT_TENANT, RateKey, TenantRatePolicy

__all__ = ["PolicyCache"]


class PolicyCache:
    """Every generation seen, per (tenant, metric), and which one is current.

    `generations_kept` bounds memory: old generations are kept so an owner can still meter
    reports that were sent under them, and dropped oldest-first beyond the bound.
    """

    def __init__(self, policies: Iterable[TenantRatePolicy] = (), *, generations_kept: int = 4):
        if generations_kept < 1:
            raise ConfigError("generations_kept", f"must be >= 1, got {generations_kept}")
        self._generations_kept = generations_kept
        self._by_scope: dict[tuple[str, Metric], dict[int, TenantRatePolicy]] = {}
        self._current: dict[tuple[str, Metric], TenantRatePolicy] = {}
        # The coordinator's tombstones: the generation at which a scope lost its own policy
        # (one entry per scope that ever had a policy: bounded as `_by_scope` is).
        self._removed: dict[tuple[str, Metric], int] = {}
        self.version = 0  # bumps on every change, so views can tell they are out of date
        self.put_all(policies)

    def put(self, policy: TenantRatePolicy) -> bool:
        """Learn one generation. Returns True if anything changed.

        Re-learning an identical generation is a no-op; a different policy under a known
        generation is refused, since it would change what existing RateKeys mean.
        """
        scope = (policy.tenant_id, policy.metric)
        known = self._by_scope.get(scope, {})
        old = known.get(policy.generation)
        if old is not None:
            if old != policy:
                raise ConfigError(
                    "generation",
                    f"generation {policy.generation} of {policy.tenant_id}/{policy.metric} "
                    "is already known with different values; a change needs a new generation",
                )
            return False
        gens = self._by_scope.setdefault(scope, {})
        gens[policy.generation] = policy
        while len(gens) > self._generations_kept:
            del gens[min(gens)]
        current = self._current.get(scope)
        newest = current.generation if current is not None else self._removed.get(scope, 0)
        if policy.generation > newest:
            self._current[scope] = policy
        self.version += 1
        return True

    def remove(self, tenant_id: str, metric: Metric, generation: int) -> bool:
        """The coordinator removed this scope's own policy at `generation` (a tombstone, newer
        than every generation before it). The tenant falls back to the default tenant's
        policy, or to `policy_unknown`; old generations stay resolvable for reports sent
        under them. Returns True if the current policy changed."""
        scope = (tenant_id, metric)
        if generation <= self._removed.get(scope, 0):
            return False
        current = self._current.get(scope)
        if current is not None and current.generation >= generation:
            return False  # a put newer than the removal already won
        self._removed[scope] = generation
        if current is None:
            return False
        del self._current[scope]
        self.version += 1
        return True

    def put_all(self, policies: Iterable[TenantRatePolicy]) -> bool:
        """Learn several generations, all or none: a conflict anywhere changes nothing."""
        batch = list(policies)
        seen: dict[tuple[str, Metric, int], TenantRatePolicy] = {}
        for p in batch:
            key = (p.tenant_id, p.metric, p.generation)
            twice = seen.get(key)
            known = self._by_scope.get((p.tenant_id, p.metric), {}).get(p.generation)
            if twice is not None and twice != p:
                raise ConfigError(
                    "generation",
                    f"generation {p.generation} of {p.tenant_id}/{p.metric} given twice "
                    "with different values",
                )
            if known is not None and known != p:
                raise ConfigError(
                    "generation",
                    f"generation {p.generation} of {p.tenant_id}/{p.metric} is already known "
                    "with different values; a change needs a new generation",
                )
            seen[key] = p
        changed = False
        for p in batch:
            changed |= self.put(p)
        return changed

    def current(self, tenant_id: str, metric: Metric) -> TenantRatePolicy | None:
        """The newest generation for this tenant, or the default tenant's, or None."""
        policy = self._current.get((tenant_id, metric))
        if policy is not None:
            return policy
        default = self._current.get((DEFAULT_TENANT, metric))
        return None if default is None else default.for_tenant(tenant_id)

    def get(self, key: RateKey) -> TenantRatePolicy | None:
        """The exact generation a RateKey names, or None if this cache has not seen it."""
        gens = self._by_scope.get((key.tenant_id, key.metric))
        if gens is not None and key.policy_generation in gens:
            return gens[key.policy_generation]
        if gens is not None and (key.tenant_id, key.metric) in self._current:
            return None  # the tenant has policies of its own, just not this generation
        default = self._by_scope.get((DEFAULT_TENANT, key.metric), {}).get(key.policy_generation)
        return None if default is None else default.for_tenant(key.tenant_id)

    def __iter__(self) -> Iterator[TenantRatePolicy]:
        for scope in sorted(self._current):
            yield self._current[scope]

    def __len__(self) -> int:
        return len(self._current)

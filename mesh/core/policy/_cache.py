"""A worker's local, versioned policy cache.

Admission never reads the coordinator: it reads this. A generation is immutable once known
(a changed limit is a new generation, so a RateKey never changes meaning), and a tenant with
no known policy is `policy_unknown`, never a permissive default.

Resolution (most specific first, as Envoy matches descriptors): a tenant's own policy, then
the default tenant's (`"*"`). A tenant part with a descriptor (`acme` + RS + `route=/up`,
`ratemesh.policy.descriptor_tenant`) resolves to its own policy, then its tenant's default
for that key (`route: "*"`), then the default tenant's exact and `"*"` entries, each giving
the descriptor its own bucket; with none of those it falls back to the tenant's plain
policy, charged on the tenant's own key (the descriptor then adds nothing).

One unit per metric: a policy naming a metric in another unit than the current
policies that name it is refused, naming both; at most METRICS_MAX metric names are held.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from mesh.errors import ConfigError
from ratemesh.policy import (
    DEFAULT_TENANT,
    DESCRIPTOR_SEP,
    DESCRIPTOR_WILDCARD,
    METRICS_MAX,
    RateKey,
    TenantRatePolicy,
    scope_name,
    split_tenant,
    unit_conflict,
)

Scope = tuple[str, str]  # (tenant part of the RateKey, metric)

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
        self._by_scope: dict[Scope, dict[int, TenantRatePolicy]] = {}
        self._current: dict[Scope, TenantRatePolicy] = {}
        # The coordinator's tombstones: the generation at which a scope lost its own policy
        # (one entry per scope that ever had a policy: bounded as `_by_scope` is).
        self._removed: dict[Scope, int] = {}
        # metric -> {tenant part: its current policy}: the unit check and the metric bound.
        self._declared: dict[str, dict[str, TenantRatePolicy]] = {}
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
                    f"generation {policy.generation} of "
                    f"{scope_name(policy.tenant_id, policy.metric)} "
                    "is already known with different values; a change needs a new generation",
                )
            return False
        self._check_unit(policy)
        gens = self._by_scope.setdefault(scope, {})
        gens[policy.generation] = policy
        while len(gens) > self._generations_kept:
            del gens[min(gens)]
        current = self._current.get(scope)
        newest = current.generation if current is not None else self._removed.get(scope, 0)
        if policy.generation > newest:
            self._current[scope] = policy
            self._declared.setdefault(policy.metric, {})[policy.tenant_id] = policy
        self.version += 1
        return True

    def _check_unit(self, policy: TenantRatePolicy) -> None:
        declared = self._declared.get(policy.metric)
        if declared is None:
            if len(self._declared) >= METRICS_MAX:
                raise ConfigError(
                    "metric",
                    f"{policy.metric!r} would be metric name {METRICS_MAX + 1}; a policy "
                    f"cache holds at most {METRICS_MAX} (METRICS_MAX)",
                )
            return
        for other in declared.values():
            if other.unit is not policy.unit and other.tenant_id != policy.tenant_id:
                raise unit_conflict(other, policy, where="policy", error=ConfigError)

    def remove(self, tenant_id: str, metric: str, generation: int) -> bool:
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
        declared = self._declared.get(metric, {})
        declared.pop(tenant_id, None)
        if not declared:
            self._declared.pop(metric, None)
        self.version += 1
        return True

    def put_all(self, policies: Iterable[TenantRatePolicy]) -> bool:
        """Learn several generations, all or none: a conflict anywhere changes nothing."""
        batch = list(policies)
        seen: dict[tuple[str, str, int], TenantRatePolicy] = {}
        for p in batch:
            key = (p.tenant_id, p.metric, p.generation)
            twice = seen.get(key)
            known = self._by_scope.get((p.tenant_id, p.metric), {}).get(p.generation)
            if twice is not None and twice != p:
                raise ConfigError(
                    "generation",
                    f"generation {p.generation} of {scope_name(p.tenant_id, p.metric)} given twice "
                    "with different values",
                )
            if known is not None and known != p:
                raise ConfigError(
                    "generation",
                    f"generation {p.generation} of {scope_name(p.tenant_id, p.metric)} is "
                    "already known with different values; a change needs a new generation",
                )
            seen[key] = p
        units: dict[str, TenantRatePolicy] = {}
        for p in batch:  # units and the metric bound, against the batch and the cache
            first = units.setdefault(p.metric, p)
            if first.unit is not p.unit:
                raise unit_conflict(first, p, where="policy", error=ConfigError)
            self._check_unit(p)
        fresh = {m for m in units if m not in self._declared}
        if len(self._declared) + len(fresh) > METRICS_MAX:
            raise ConfigError(
                "metric",
                f"{len(fresh)} new metric names would make more than {METRICS_MAX} (METRICS_MAX)",
            )
        changed = False
        for p in batch:
            changed |= self.put(p)
        return changed

    def declared(self) -> list[str]:
        """The metric names the current policies declare, sorted."""
        return sorted(self._declared)

    def unit_of(self, metric: str) -> TenantRatePolicy | None:
        """A current policy naming `metric` (all of them agree on its unit), or None."""
        declared = self._declared.get(metric)
        return None if not declared else next(iter(declared.values()))

    def current(self, tenant_id: str, metric: str) -> TenantRatePolicy | None:
        """The newest generation for this tenant part (module docstring: most specific
        first), or None."""
        policy = self._current.get((tenant_id, metric))
        if policy is not None:
            return policy
        if DESCRIPTOR_SEP in tenant_id:
            for scope in _fallbacks(tenant_id):
                policy = self._current.get((scope, metric))
                if policy is not None:
                    return policy.for_tenant(tenant_id)
            return self.current(split_tenant(tenant_id)[0], metric)
        default = self._current.get((DEFAULT_TENANT, metric))
        return None if default is None else default.for_tenant(tenant_id)

    def get(self, key: RateKey) -> TenantRatePolicy | None:
        """The exact generation a RateKey names, or None if this cache has not seen it."""
        gens = self._by_scope.get((key.tenant_id, key.metric))
        if gens is not None and key.policy_generation in gens:
            return gens[key.policy_generation]
        if gens is not None and (key.tenant_id, key.metric) in self._current:
            return None  # the tenant has policies of its own, just not this generation
        scopes = _fallbacks(key.tenant_id) if DESCRIPTOR_SEP in key.tenant_id else ()
        for scope in (*scopes, DEFAULT_TENANT):
            default = self._by_scope.get((scope, key.metric), {}).get(key.policy_generation)
            if default is not None:
                return default.for_tenant(key.tenant_id)
            if scope != DEFAULT_TENANT and (scope, key.metric) in self._current:
                return None  # the more specific default has other generations
        return None

    def __iter__(self) -> Iterator[TenantRatePolicy]:
        for scope in sorted(self._current):
            yield self._current[scope]

    def __len__(self) -> int:
        return len(self._current)


def _fallbacks(tenant_id: str) -> tuple[str, ...]:
    """The descriptor defaults a tenant part with a descriptor falls back to, in order."""
    tenant, desc = split_tenant(tenant_id)
    assert desc is not None
    key, value = desc
    wild = f"{key}={DESCRIPTOR_WILDCARD}"
    out = [f"{tenant}{DESCRIPTOR_SEP}{wild}"]
    if tenant != DEFAULT_TENANT:
        out += [
            f"{DEFAULT_TENANT}{DESCRIPTOR_SEP}{key}={value}",
            f"{DEFAULT_TENANT}{DESCRIPTOR_SEP}{wild}",
        ]
    return tuple(s for s in out if s != tenant_id)

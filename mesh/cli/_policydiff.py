"""What `mesh policy apply` would change: the diff of a policies file against governord's
current policies, with the generation each change gets (pure: no I/O, tested alone)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from mesh.core.policy import TenantRatePolicy
from mesh.errors import ConfigError
from ratemesh.policy import default_unit, scope_name, split_tenant

__all__ = ["Change", "Diff", "compute_diff", "policy_values"]

_BASE_VALUES = ("target_rate", "global_burst", "local_burst_cap", "enabled", "mode")
_VALUES = (*_BASE_VALUES, "unit")
_DIFFED = (*_VALUES, "posture")  # what a change lists (a posture moves no number)


@dataclass(slots=True)
class Change:
    kind: str  # added | changed | removed
    tenant_id: str
    metric: str
    generation: int  # the generation it gets (a removal: its tombstone's)
    base: int  # the key's last generation the change was computed against (0: none)
    policy: TenantRatePolicy | None  # None for a removal
    was: TenantRatePolicy | None = None
    explicit: bool = False

    def to_json(self) -> dict[str, Any]:
        tenant, desc = split_tenant(self.tenant_id)
        out: dict[str, Any] = {
            "tenant_id": tenant,
            "metric": self.metric,
            "generation": self.generation,
        }
        if desc is not None:  # as a policy's mapping shows it
            out["descriptor"] = {desc[0]: desc[1]}
        if self.was is not None:
            out["from_generation"] = self.was.generation
        if self.policy is not None:
            out["policy"] = self.policy.to_dict()
        if self.was is not None and self.policy is not None:
            out["changes"] = {
                k: [_plain(getattr(self.was, k)), _plain(getattr(self.policy, k))]
                for k in _DIFFED
                if getattr(self.was, k) != getattr(self.policy, k)
            }
        return out

    def line(self) -> str:
        name = scope_name(self.tenant_id, self.metric)
        if self.kind == "added":
            assert self.policy is not None
            return f"+ {name}  generation {self.generation}: {policy_values(self.policy)}"
        if self.kind == "removed":
            assert self.was is not None
            return (
                f"- {name}  generation {self.was.generation} removed "
                f"(tombstone generation {self.generation})"
            )
        assert self.policy is not None and self.was is not None
        moved = ", ".join(
            f"{k} {_plain(getattr(self.was, k))} -> {_plain(getattr(self.policy, k))}"
            for k in _DIFFED
            if getattr(self.was, k) != getattr(self.policy, k)
        )
        return f"~ {name}  generation {self.was.generation} -> {self.generation}: {moved}"


@dataclass(slots=True)
class Diff:
    revision: int
    changes: list[Change] = field(default_factory=list)
    unchanged: int = 0
    kept: list[str] = field(default_factory=list)  # keys not in the file, left alone

    def of(self, kind: str) -> list[Change]:
        return [c for c in self.changes if c.kind == kind]


def _plain(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


def policy_values(p: TenantRatePolicy) -> str:
    """The values as a line; the unit only when it is not the metric name's default. As
    written (`to_dict`): a rate not whole per second as text, its bursts in units."""
    keys = _VALUES if p.unit is not default_unit(p.metric) else _BASE_VALUES
    written = p.to_dict()
    return ", ".join(f"{k} {_plain(written.get(k, getattr(p, k)))}" for k in keys)


def compute_diff(
    desired: list[tuple[TenantRatePolicy, bool]],
    current: list[TenantRatePolicy],
    last: dict[tuple[str, str], int],
    revision: int,
    *,
    prune: bool,
) -> Diff:
    """What applying `desired` to governord's `current` (with each key's `last` generation,
    tombstones included) changes. A file's explicit generation below governord's current
    would silently not become current: refused here, naming the key."""
    have = {(p.tenant_id, p.metric): p for p in current}
    diff = Diff(revision)
    named = set()
    for policy, explicit in desired:
        scope = (policy.tenant_id, policy.metric)
        named.add(scope)
        was = have.get(scope)
        base = last.get(scope, 0)
        name = scope_name(policy.tenant_id, policy.metric)
        if explicit and was is not None and policy.generation == was.generation:
            if policy != was:
                raise ConfigError(
                    f"{name}.generation",
                    f"generation {policy.generation} is governord's current with other values "
                    f"({policy_values(was)}); leave generation out to push these as {base + 1}",
                )
            diff.unchanged += 1
            continue
        if explicit and policy.generation <= base:
            raise ConfigError(
                f"{name}.generation",
                f"generation {policy.generation} is not above governord's last ({base}); "
                f"leave generation out to push these values as {base + 1}",
            )
        if not explicit and was is not None and was.values() == policy.values():
            diff.unchanged += 1
            continue
        generation = policy.generation if explicit else base + 1
        stored = TenantRatePolicy.from_dict(
            {**policy.to_dict(), "generation": generation}, error=ConfigError
        )
        kind = "added" if was is None else "changed"
        diff.changes.append(
            Change(kind, policy.tenant_id, policy.metric, generation, base, stored, was, explicit)
        )
    for scope in sorted(set(have) - named):
        p = have[scope]
        if prune:
            base = last.get(scope, p.generation)
            diff.changes.append(Change("removed", p.tenant_id, p.metric, base + 1, base, None, p))
        else:
            diff.kept.append(scope_name(p.tenant_id, p.metric))
    return diff

"""The policies file: one YAML format for a node's `policies.file`, governord's bootstrap
(`coordinator.policies_file`) and `mesh policy apply -f`.

The file holds a list of policies, or a mapping with one key `policies:` holding that list
(and, optionally, `posture:`, which every entry that names none takes: a whole generation in
shadow, docs/policies.md). Each entry is a `TenantRatePolicy` mapping. For `mesh policy
apply` an entry may leave out `generation` (governord allocates the next one); a node and
governord's bootstrap need it, since it is the number both sides will meter under.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratemesh.errors import ConfigError, ConfigTypeError, RatemeshError
from ratemesh.policy import TenantRatePolicy, check_units, scope_name
from ratemesh.yamlfile import load_yaml

__all__ = ["POLICIES_PER_FILE_MAX", "Desired", "load_policy_file", "parse_policy_list"]

# A file is read whole and sent in one apply; the bound keeps it inside one coordinator message.
POLICIES_PER_FILE_MAX = 2048


@dataclass(frozen=True, slots=True)
class Desired:
    """One entry of a policies file; `explicit` says whether it named its generation."""

    policy: TenantRatePolicy
    explicit: bool


def parse_policy_list(
    data: Any,
    *,
    where: str,
    error: type[RatemeshError] = ConfigError,
    generation_required: bool = True,
    one_per_key: bool = False,
) -> list[Desired]:
    """Validate a decoded file; every mistake names `where[i].field`. A node's file may hold
    several generations of one (tenant_id, metric); an apply (`one_per_key`) may not, since
    it says what each key's policy should be now."""
    if isinstance(data, dict) and set(data) == {"policies", "posture"}:
        data = _with_posture(data["policies"], data["posture"])
    if isinstance(data, dict) and set(data) == {"policies"}:
        data = data["policies"]
    if not isinstance(data, list):
        raise error.type_error(where, "must hold a list of policies")
    if len(data) > POLICIES_PER_FILE_MAX:
        raise error(where, f"holds {len(data)} policies; at most {POLICIES_PER_FILE_MAX}")
    out: list[Desired] = []
    seen: dict[tuple[str, str], int] = {}
    for i, raw in enumerate(data):
        here = f"{where}[{i}]"
        explicit = not isinstance(raw, dict) or "generation" in raw
        if not explicit and not generation_required:
            raw = {**raw, "generation": 1}  # validated as the first; governord numbers it
        policy = TenantRatePolicy.from_dict(raw, where=here, error=error, written=True)
        key = (policy.tenant_id, policy.metric)
        if one_per_key and key in seen:
            raise error(
                f"{here}.tenant_id",
                f"{scope_name(policy.tenant_id, policy.metric)} is already entry [{seen[key]}]; "
                "one entry per (tenant_id, descriptor, metric)",
            )
        seen[key] = i
        out.append(Desired(policy, explicit))
    check_units([d.policy for d in out], where=where, error=error)
    return out


def _with_posture(entries: Any, posture: Any) -> Any:
    """The file's `posture:` on every entry that names none (each entry validates it)."""
    if not isinstance(entries, list):
        return entries  # the list check names it
    return [{"posture": posture, **e} if isinstance(e, dict) else e for e in entries]


def load_policy_file(
    path: str | Path,
    *,
    where: str = "policies",
    error: type[ConfigError] = ConfigError,
    generation_required: bool = True,
    one_per_key: bool = False,
) -> list[Desired]:
    """Read and validate a policies file; a mistake is one `error` naming the file or entry."""
    data = load_yaml(path, field=where, error=error)
    try:
        return parse_policy_list(
            data,
            where=where,
            error=error,
            generation_required=generation_required,
            one_per_key=one_per_key,
        )
    except ConfigTypeError as exc:
        if exc.field == where:
            raise error.type_error(where, f"{path} must hold a list of policies") from exc
        raise

"""governord's bootstrap of the mesh's policies: ``coordinator.policies_file``, imported once.

The file is the one the nodes load, so importing it under its own numbers makes governord and
the nodes agree on what each generation means (docs/policies.md, "the bootstrap").
"""

from __future__ import annotations

from governor.authority import Authority
from governor.config import CoordinatorSettings
from governor.engine import Engine, GenerationConflict
from ratemesh.policy import TenantRatePolicy, scope_name

__all__ = ["import_bootstrap"]


def import_bootstrap(authority: Authority, settings: CoordinatorSettings) -> list[str]:
    """Import ``coordinator.policies_file`` once: every (tenant_id, metric) governord holds
    nothing for (never had a policy) gets the file's generations, under the file's numbers, so
    nodes that load the same file agree with governord. A key governord already holds is left
    alone (its record wins); a generation of it that the file gives other values is returned
    as a warning line, since nodes loading the file would refuse governord's."""
    if not settings.bootstrap:
        return []

    def bootstrap(e: Engine) -> list[str]:
        book = e.state.policies
        fresh = {(p.tenant_id, p.metric) for p in settings.bootstrap} - set(book.keys)
        warnings = []
        for p in sorted(settings.bootstrap, key=lambda p: (p.tenant_id, p.metric, p.generation)):
            if (p.tenant_id, p.metric) in fresh:
                e.put_policy(p, allocate=False)
                continue
            try:
                _check_known(e, p)
            except GenerationConflict as exc:
                warnings.append(f"coordinator.policies_file: {exc}")
        return warnings

    return list(authority.call(bootstrap))


def _check_known(e: Engine, p: TenantRatePolicy) -> None:
    key = e.state.policies.keys[(p.tenant_id, p.metric)]
    name = f"{scope_name(p.tenant_id, p.metric)} generation {p.generation}"
    record = key.find(p.generation)
    if record is not None and record.policy != p:
        raise GenerationConflict(
            "generation",
            f"{name} differs from governord's record, which wins; nodes that load this file "
            "refuse governord's",
        )
    if p.generation > key.last.generation:
        raise GenerationConflict(
            "generation",
            f"{name} is above governord's last ({key.last.generation}), which was not imported "
            "(governord holds this key already); governord may give that number to other "
            "values, which nodes that load this file would refuse",
        )

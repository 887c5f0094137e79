"""What a fleet says about its policies: each member's Status answer read for the
generation it enforces per limit, and the comparison `mesh status --fleet` prints.

Sans-I/O: the gathering is `mesh.peer.fetch_fleet`; the bench reads the same answers. A
member's answer is untrusted: a malformed `policies.enforced` makes that member `bad_answer`
(flagged like an unreachable one), never an exception past this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mesh.errors import MessageError
from ratemesh.policy import DESCRIPTOR_SEP

__all__ = [
    "ENFORCED_ROWS_MAX",
    "Enforced",
    "MemberAnswer",
    "enforced_of",
    "fleet_report",
    "fleet_table",
]

# Limits read from one member's answer; a node lists at most ENFORCED_SHOWN_MAX (the same
# number, mesh.node._health), so more is a malformed answer.
ENFORCED_ROWS_MAX = 10_000
NAME_MAX = 256  # a tenant or metric name in an answer; longer is malformed

Enforced = dict[tuple[str, str], int]  # (tenant, metric) -> generation


@dataclass(frozen=True, slots=True)
class MemberAnswer:
    """One ring member as `mesh status --fleet` found it: `enforced`, or why not (`error`)."""

    member_id: str
    address: str
    enforced: Enforced | None
    error: str | None = None


def enforced_of(status: Any) -> Enforced:
    """The per-limit generations in a member's Status answer; MessageError if malformed."""
    pol = status.get("policies") if isinstance(status, dict) else None
    rows = pol.get("enforced") if isinstance(pol, dict) else None
    if not isinstance(rows, list):
        raise MessageError("policies.enforced", "missing (a member from an older release?)")
    if len(rows) > ENFORCED_ROWS_MAX:
        raise MessageError("policies.enforced", f"more than {ENFORCED_ROWS_MAX} rows")
    out: Enforced = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise MessageError(f"policies.enforced[{i}]", "must be a mapping")
        tenant, metric, gen = row.get("tenant"), row.get("metric"), row.get("generation")
        if (
            not (isinstance(tenant, str) and isinstance(metric, str))
            or max(len(tenant), len(metric)) > NAME_MAX
        ):
            raise MessageError(f"policies.enforced[{i}]", "tenant and metric must be names")
        if type(gen) is not int or not 0 <= gen < 1 << 63:
            raise MessageError(f"policies.enforced[{i}].generation", "must be an integer >= 0")
        desc = row.get("descriptor")
        if desc is not None:  # a descriptor's own limit (/health shows its key apart)
            if not isinstance(desc, str) or "=" not in desc or len(desc) > NAME_MAX:
                raise MessageError(f"policies.enforced[{i}].descriptor", "must be key=value")
            tenant = f"{tenant}{DESCRIPTOR_SEP}{desc}"
        out[(tenant, metric)] = gen
    return out


def fleet_report(answers: list[MemberAnswer]) -> dict[str, Any]:
    """Compare the members: a limit is diverged when the members that answered do not all
    enforce the same generation of it (a member enforcing none counts as a difference);
    the fleet is diverged when any limit is, or any member did not answer."""
    answered = sorted((a for a in answers if a.enforced is not None), key=_id)
    limits = sorted({k for a in answered for k in a.enforced or {}})
    rows = []
    for tenant, metric in limits:
        gens = {a.member_id: (a.enforced or {}).get((tenant, metric)) for a in answered}
        base, sep, desc = tenant.partition(DESCRIPTOR_SEP)
        rows.append(
            {
                "tenant": base,
                **({"descriptor": desc} if sep else {}),
                "metric": metric,
                "generations": gens,
                "diverged": len(set(gens.values())) > 1,
            }
        )
    unreachable = sorted(a.member_id for a in answers if a.enforced is None)
    diverged_limits = sum(1 for r in rows if r["diverged"])
    return {
        "members": {
            a.member_id: {
                "address": a.address,
                "reachable": a.enforced is not None,
                "error": a.error,
            }
            for a in sorted(answers, key=_id)
        },
        "limits": rows,
        "unreachable": unreachable,
        "diverged_limits": diverged_limits,
        "diverged": bool(diverged_limits or unreachable),
    }


def fleet_table(report: dict[str, Any]) -> str:
    """member, limit, generation, flag: one row per member and limit, then the unreachable."""
    lines = [f"{'member':<24} {'limit':<40} {'generation':>10}  flag"]
    for row in report["limits"]:
        limit = f"{row['tenant']}/{row['metric']}"
        for member, gen in sorted(row["generations"].items()):
            flag = "DIVERGED" if row["diverged"] else ""
            shown = "-" if gen is None else str(gen)
            lines.append(f"{member:<24} {limit:<40} {shown:>10}  {flag}".rstrip())
    for member in report["unreachable"]:
        error = report["members"][member]["error"]
        lines.append(f"{member:<24} {'*':<40} {'?':>10}  UNREACHABLE: {error}")
    n = len(report["members"])
    verdict = (
        f"DIVERGED: {report['diverged_limits']} limits differ, "
        f"{len(report['unreachable'])} of {n} members unreachable"
        if report["diverged"]
        else f"converged: {n} members enforce the same generation of every limit"
    )
    return "\n".join([*lines, verdict])


def _id(a: MemberAnswer) -> str:
    return a.member_id

"""`global`: the mesh's view of the key (owner GCRA + snapshots; `mesh.core.reporter.GlobalGate`
decides and answers for itself), opened through this worker's reporter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.core.admission._gates import FixedGate
from mesh.core.gate import NEVER, Gate
from mesh.core.policy import BOUNDS, TenantRatePolicy
from mesh.core.verdict import Reason, Suspension

if TYPE_CHECKING:
    from mesh.core.admission._admission import Admission

__all__ = ["open_global"]


def open_global(admission: Admission, policy: TenantRatePolicy) -> Gate:
    """The reporter's view of the key; with no mesh (no reporter), shut and saying so."""
    if admission.reporter is None:
        return FixedGate(
            policy,
            _ignore,
            False,
            BOUNDS["global_stale"],
            Suspension.OWNER_UNREACHABLE,
            Reason.OWNER_UNREACHABLE,
        )
    return admission.reporter.open_gate(policy)


def _ignore(v: Gate) -> None:
    v.flush_at = NEVER

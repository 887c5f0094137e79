"""The owner side: per-key GCRA meters, idempotent report apply, snapshots (pure)."""

from mesh.core.owner._owner import Owner
from mesh.core.owner._plausible import Refusal
from mesh.core.owner._state import Applied, KeyState, ReporterState

__all__ = ["Applied", "KeyState", "Owner", "Refusal", "ReporterState"]

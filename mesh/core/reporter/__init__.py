"""The worker side: local views, usage reports, snapshot intake (pure)."""

from mesh.core.reporter._reporter import Reporter
from mesh.core.reporter._gate import GlobalGate, Inflight, SnapshotState

__all__ = ["GlobalGate", "Inflight", "Reporter", "SnapshotState"]

"""The worker side: local views, usage reports, snapshot intake (pure)."""

from mesh.core.reporter._excess import excess_estimate
from mesh.core.reporter._gate import GlobalGate, Inflight, SnapshotState
from mesh.core.reporter._reporter import Reporter

__all__ = ["GlobalGate", "Inflight", "Reporter", "SnapshotState", "excess_estimate"]

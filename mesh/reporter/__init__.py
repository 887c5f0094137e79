"""The worker side: local views, usage reports, snapshot intake (pure)."""

from mesh.reporter._reporter import Reporter
from mesh.reporter._view import GlobalView, Inflight, ViewState

__all__ = ["GlobalView", "Inflight", "Reporter", "ViewState"]

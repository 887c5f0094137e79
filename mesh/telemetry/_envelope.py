"""The envelope checks live below both planes, in ``ratemesh.envelope`` (one formula, one
place); the mesh's telemetry re-exports them here."""

from __future__ import annotations

from ratemesh.envelope import excess_over_times, excess_over_windows

__all__ = ["excess_over_times", "excess_over_windows"]

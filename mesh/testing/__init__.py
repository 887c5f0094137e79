"""Test and simulation harnesses around the real cores: an in-memory fleet on a virtual clock.

Never imported by `mesh.core` or `mesh.node` (an import-linter contract says so); the
simulator, `mesh demo --memory` and the tests use it. `mesh.testing.coordinator` (an
in-process coordinator over gRPC, for tests and benches) is imported on its own, so the rest
stays free of grpc.
"""

from mesh.testing.fleet import MemoryFleet, Network, Offered, Scheduler, SimpleNetwork, drive

__all__ = ["MemoryFleet", "Network", "Offered", "Scheduler", "SimpleNetwork", "drive"]

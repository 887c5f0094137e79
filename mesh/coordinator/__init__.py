"""Where policies come from at run time: the coordinator interface, an in-process
coordinator, and the feed that keeps a worker's PolicyCache current (watch, with a
short-TTL polling fallback). The gRPC client and service live in `mesh.peer`."""

from mesh.coordinator._feed import PolicyFeed
from mesh.coordinator._source import PolicySnapshot, PolicySource
from mesh.coordinator._store import PolicyStore

__all__ = ["PolicyFeed", "PolicySnapshot", "PolicySource", "PolicyStore"]

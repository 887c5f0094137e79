"""Wires one worker on an event loop: admission, reporter, owner, ring, policy, peer and
telemetry. `Mesh` is the whole of it for an embedding app."""

from mesh.node._driver import NodeDriver
from mesh.node._gc import tune_gc
from mesh.node._mesh import Mesh, TransportFactory, new_event_loop

__all__ = ["Mesh", "NodeDriver", "TransportFactory", "new_event_loop", "tune_gc"]

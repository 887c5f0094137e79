"""Wires one worker on an event loop: admission, reporter, owner, ring, policy, peer, telemetry.

Reserved: the asyncio node lands with the mesh node issue. Until then `mesh.member.Member`
is the whole of a worker without I/O, and `mesh.inmem.MemoryFleet` drives members in memory.
"""

__all__: list[str] = []

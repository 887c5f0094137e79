"""A free loopback port, for the commands and benchmarks that start members or daemons.

One place for both planes: `mesh demo` (mesh.cli) and `governord bench` (governor.bench)
both need it and may import only what stands below them, and governor may not import bench.
It binds a socket, as `ratemesh.operator.probe_bind` does; the ratemesh contract forbids
asyncio, grpc and the database drivers, not the socket module.
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now: bound to learn it, then closed (another
    process may take it before the caller binds it; callers on loopback accept that)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

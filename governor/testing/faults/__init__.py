"""Network faults for governord's HA tests and bench, and the mesh's (docs/faults.md).

`DelayProxy` is the one TCP proxy between a client and a server (a governord and its
PostgreSQL, a client and a governord, two mesh members) that delays, blackholes (a silent
partition), refuses, partitions or cuts (resets) what passes, changed while it runs; it needs
nothing but a free port. `Netns` (root, iproute2 and
iptables) puts a process in its own network namespace joined to the host by a veth pair and
partitions it with iptables DROP rules; `Netns.proxy_to` gives that process a way to the
host's PostgreSQL on 127.0.0.1. Test tooling: never imported by governor's engine, store,
server, client or authority.
"""

from ._netns import (
    NETNS_PER_PROCESS_MAX,
    Netns,
    NetnsError,
    NetnsUnavailable,
    check_available,
    sweep_stale,
)
from ._proxy import (
    BUFFERED_BYTES_MAX,
    CONNECTIONS_MAX,
    DELAY_MS_MAX,
    READ_CHUNK_BYTES,
    DelayProxy,
    ProxyError,
    ProxyStats,
)

__all__ = [
    "BUFFERED_BYTES_MAX",
    "CONNECTIONS_MAX",
    "DELAY_MS_MAX",
    "NETNS_PER_PROCESS_MAX",
    "READ_CHUNK_BYTES",
    "DelayProxy",
    "Netns",
    "NetnsError",
    "NetnsUnavailable",
    "ProxyError",
    "ProxyStats",
    "check_available",
    "sweep_stale",
]

"""Who may hold a connection to an HTTP port: one bookkeeping for governord's HTTP port and
the node's HTTP servers (docs/security.md), sans-I/O (the servers close what it names).

A connection is *waiting* from its accept until its request head is complete (and again
between keep-alive requests), and *busy* while its request is served. The bounds:

* ``peer_max`` connections from one peer address; the next is refused at once.
* ``connections_max`` at once from everyone. At the bound a new connection evicts the oldest
  waiting one (a silent or slow socket gives its place to one that is speaking), so idle and
  slowloris sockets cannot keep a probe out; only when every connection is busy is it
  refused, or taken on the reserve. One that has not yet completed a request goes first; a
  keep-alive connection between requests only when there is none such: its client may be
  sending its next request as it is closed, which it sees as a failed call (HTTP clients do
  not resend a POST on a closed connection), while a socket that never spoke loses nothing.
* ``reserve`` connections over ``connections_max`` answer liveness and readiness only: a
  probe still gets in when every ordinary slot is busy.

How long a connection may stay waiting is the server's timer (the head timeout); this
object only counts.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Hashable
from enum import Enum
from typing import Generic, NamedTuple, TypeVar

__all__ = ["Admit", "ConnGate", "Opened", "loopback_peer"]

C = TypeVar("C", bound=Hashable)


class Admit(Enum):
    SERVE = "serve"  # an ordinary slot
    PROBES_ONLY = "probes_only"  # the reserve: liveness and readiness only
    REFUSED_PEER = "refused_peer"  # its peer holds peer_max already
    REFUSED_FULL = "refused_full"  # every slot and the reserve are busy


class Opened(NamedTuple, Generic[C]):
    admit: Admit
    evicted: C | None  # the waiting connection to close to make room, if any


class ConnGate(Generic[C]):
    def __init__(self, connections_max: int, peer_max: int, reserve: int) -> None:
        if connections_max < 1 or peer_max < 1 or reserve < 0:
            raise ValueError("connections_max and peer_max must be >= 1, reserve >= 0")
        self.connections_max = connections_max
        self.peer_max = peer_max
        self.reserve = reserve
        self._peer_of: dict[C, str] = {}
        self._per_peer: dict[str, int] = {}  # bounded: at most connections_max + reserve keys
        self._waiting: OrderedDict[C, None] = OrderedDict()  # never served yet, oldest first
        self._kept: OrderedDict[C, None] = OrderedDict()  # keep-alive between requests
        self.refused: dict[str, int] = {"peer": 0, "full": 0}  # by why
        self.evicted = 0
        self.reserved = 0  # connections taken on the reserve

    @property
    def open(self) -> int:
        return len(self._peer_of)

    def opened(self, conn: C, peer: str) -> Opened[C]:
        """A new connection from `peer`: whether it is served, and what to close for it."""
        if self._per_peer.get(peer, 0) >= self.peer_max:
            self.refused["peer"] += 1
            return Opened(Admit.REFUSED_PEER, None)
        admit, evicted = Admit.SERVE, None
        if self.open >= self.connections_max:
            if self._waiting or self._kept:
                evicted, _ = (self._waiting or self._kept).popitem(last=False)
                self._forget(evicted)
                self.evicted += 1
            elif self.open < self.connections_max + self.reserve:
                admit = Admit.PROBES_ONLY
                self.reserved += 1
            else:
                self.refused["full"] += 1
                return Opened(Admit.REFUSED_FULL, None)
        self._peer_of[conn] = peer
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        self._waiting[conn] = None
        return Opened(admit, evicted)

    def busy(self, conn: C) -> None:
        """Its request head is complete: it is served, not evicted."""
        self._waiting.pop(conn, None)
        self._kept.pop(conn, None)

    def idle(self, conn: C) -> None:
        """Its response is sent and it stays open for another request: evictable again."""
        if conn in self._peer_of:
            self._kept[conn] = None

    def closed(self, conn: C) -> None:
        self._waiting.pop(conn, None)
        self._kept.pop(conn, None)
        self._forget(conn)

    def _forget(self, conn: C) -> None:
        peer = self._peer_of.pop(conn, None)
        if peer is None:
            return
        left = self._per_peer[peer] - 1
        if left:
            self._per_peer[peer] = left
        else:
            del self._per_peer[peer]

    def counts(self) -> dict[str, int]:
        """For /health and the logs: what is open, waiting, refused and evicted."""
        return {
            "open": self.open,
            "waiting": len(self._waiting) + len(self._kept),
            "evicted": self.evicted,
            "reserved": self.reserved,
            **{f"refused_{k}": v for k, v in sorted(self.refused.items())},
        }


def loopback_peer(peer: str) -> bool:
    """Whether a peer address (as a socket reports it) is this machine: 127/8, ::1, or an
    IPv4-mapped 127/8."""
    try:
        ip = ipaddress.ip_address(peer)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback

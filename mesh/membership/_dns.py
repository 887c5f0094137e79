"""Membership from DNS: the A or SRV records of one name (a Kubernetes headless service),
re-resolved every `interval_ms`.

Members. A records: the id is the address, the peer address is address:port (port from
config). SRV records: the id is the target name (lower case, no trailing dot), the peer
address is the target's address from the answer's additional section (the name itself when
the server sent none) with the record's port. A member is named by DNS, so a node's
`member_id` must be that name (for A records, e.g. `member_id_env: POD_IP`); a node that is
not in the records yet (not ready) works as a worker that owns no keys.

Duplicate ids: DNS has no lease or holder to compare, so nothing is checked
here. Peers dial the address the records give, and that port takes no second bind
(SO_REUSEPORT off), so one process answers for an id; a second process that sets the same
`member_id` and listens elsewhere (another port, another pod) is not detected: it runs as a
worker under that name. Deriving the id from the pod (`member_id_env: POD_IP`) avoids it.

Epoch. etcd's revision is one counter every member reads from one place; DNS has none (an
SOA serial, where a server keeps one, moves with any change in the zone and differs between
replicas), and a hash of the member set, which every member would compute alike, is not
monotone: a set that comes back would step the epoch back, while owners, reporters and the
driver order rings and snapshots by it. So the epoch comes from the wall clock, in a form
members compute alike without talking to each other (`next_epoch`):

* resolutions run at wall-clock multiples of `interval_ms`, so members with synchronised
  clocks ask at the same instants and see the same answers;
* time is cut into slots of `epoch_slot_ms`; the first resolution in a slot re-stamps the
  epoch to the slot's start (ms since the Unix epoch), and each change of the member set
  seen within the slot adds one. Members that saw the same changes in the same slot agree,
  at whichever resolution they saw them;
* a member's first answer takes the slot's start: the lowest epoch the others may hold, so
  a starting member does not run ahead of them.

Members that saw the changes differently (a caching resolver that lags, a change seen on
both sides of a slot boundary, two changes in one slot seen as one) agree again at the next
slot's start. Until then an owner refuses reports stamped with an epoch above its own (the
worker retries), which restricts rather than overshoots. Each re-stamp is a new ring with
the same members; owners start keys that are new to them conservatively for a moment.

An unreachable server, an error answer, or an empty one keeps the last view, marked stale
(share limits decay to N=1 and say so): a fleet never shrinks to nothing because a record
vanished.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from mesh.errors import ConfigError, MeshError, PeerUnavailable
from mesh.membership._source import MembershipView, Publish

__all__ = ["DnsMembership", "next_epoch"]

log = logging.getLogger("mesh.membership")


def next_epoch(prev: int, slot_start_ms: int, *, first: bool, changed: bool) -> int:
    """The epoch after a resolution in the slot starting at `slot_start_ms`.

    Re-stamp to the slot's start when a new slot began, add one for a changed member set,
    never step back (a clock stepped back still moves the epoch forward on a change)."""
    base = max(prev, slot_start_ms)
    return base + 1 if changed and not first else base


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class DnsMembership:
    def __init__(
        self,
        name: str,
        *,
        record: str,
        member_id: str,
        port: int = 0,
        nameservers: Sequence[tuple[str, int]] = (),
        interval_ms: int = 1000,
        epoch_slot_ms: int = 30_000,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        if record not in ("a", "srv"):
            raise ConfigError(
                "membership.record", f"unknown value {record!r}; expected one of: a, srv"
            )
        if record == "a" and not 0 < port < 65536:
            raise ConfigError("membership.port", "is required for A records")
        if epoch_slot_ms < 2 * interval_ms:
            raise ConfigError("membership.epoch_slot_ms", "must be at least 2 x interval_ms")
        self.name = name
        self.record = record
        self.member_id = member_id
        self.port = port
        self.interval_ms = interval_ms
        self.epoch_slot_ms = epoch_slot_ms
        self.clock_ms = clock_ms
        self.resolver = _resolver(nameservers, interval_ms / 1000)
        self.view = MembershipView()
        self.last_error = ""
        self._publish: Publish = lambda v: None
        self._first = True
        self._self_listed: bool | None = None

    async def run(self, publish: Publish) -> None:
        self._publish = publish
        t = self.clock_ms()
        while True:
            try:
                members = await self.resolve()
            except MeshError as exc:
                self._failed(str(exc))
            except Exception as exc:  # never stop following membership: log, keep the view
                log.exception("dns membership failed")
                self._failed(repr(exc))
            else:
                self._adopt(members, t)
            now = self.clock_ms()
            t = now - now % self.interval_ms + self.interval_ms  # the next aligned instant
            await asyncio.sleep((t - now) / 1000)

    async def resolve(self) -> dict[str, str]:
        """The members the records name now (id -> peer address); never empty."""
        rdtype = dns.rdatatype.SRV if self.record == "srv" else dns.rdatatype.A
        try:
            answer = await self.resolver.resolve(self.name, rdtype)
        except dns.exception.DNSException as exc:
            raise PeerUnavailable(
                "dns", f"{self.name} {self.record.upper()}: {exc or type(exc).__name__}"
            ) from exc
        except OSError as exc:
            raise PeerUnavailable("dns", f"{self.name}: {exc}") from exc
        if answer.rrset is None:
            raise PeerUnavailable("dns", f"{self.name}: empty answer")
        if self.record == "a":
            return {r.address: f"{r.address}:{self.port}" for r in answer.rrset}
        glue: dict[str, str] = {}
        for rrset in answer.response.additional:
            if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
                host = _host(rrset.name.to_text())
                addrs = sorted(r.address for r in rrset)
                glue.setdefault(host, addrs[0])
        members: dict[str, str] = {}
        for r in sorted(answer.rrset, key=lambda r: (r.priority, r.port, r.target.to_text())):
            target = _host(r.target.to_text())
            if target and target not in members:
                members[target] = _join(glue.get(target, target), r.port)
        if not members:
            raise PeerUnavailable("dns", f"{self.name}: no usable SRV target")
        return members

    def _adopt(self, members: dict[str, str], t_ms: int) -> None:
        slot = t_ms - t_ms % self.epoch_slot_ms
        changed = members != self.view.members
        epoch = next_epoch(self.view.epoch, slot, first=self._first, changed=changed)
        self._first = False
        self.last_error = ""
        listed = self.member_id in members
        if listed != self._self_listed:
            self._self_listed = listed
            if not listed:
                log.warning(
                    "dns membership: %s is not among the records of %s (%s): it "
                    "owns no keys until it is",
                    self.member_id,
                    self.name,
                    ", ".join(sorted(members)),
                )
        view = MembershipView(members, epoch, False)
        if view != self.view:
            self._emit(view)

    def _failed(self, error: str) -> None:
        self.last_error = error
        if not self.view.stale:
            log.warning("dns membership: %s; keeping the last view, marked stale", error)
            self._emit(MembershipView(self.view.members, self.view.epoch, True))

    def _emit(self, view: MembershipView) -> None:
        self.view = view
        self._publish(view)

    async def leave(self) -> None:
        pass  # the records are the orchestrator's: a stopping pod leaves its endpoints

    async def close(self) -> None:
        pass  # the resolver holds no connection between queries


def _resolver(
    nameservers: Sequence[tuple[str, int]], lifetime_s: float
) -> dns.asyncresolver.Resolver:
    """A resolver for the configured servers, else the system's (/etc/resolv.conf)."""
    if nameservers:
        r = dns.asyncresolver.Resolver(configure=False)
        r.nameservers = [dns.nameserver.Do53Nameserver(ip, port) for ip, port in nameservers]
    else:
        try:
            r = dns.asyncresolver.Resolver()
        except dns.resolver.NoResolverConfiguration as exc:
            raise ConfigError(
                "membership.nameservers",
                "none configured and the system has no resolver configuration",
            ) from exc
    r.lifetime = r.timeout = lifetime_s  # an answer later than the next poll is no answer
    return r


def _host(name: str) -> str:
    return name.rstrip(".").lower()


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

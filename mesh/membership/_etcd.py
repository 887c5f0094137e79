"""Membership from etcd v3: each member keeps a lease-backed key under a prefix and
watches the prefix.

The ring epoch is the etcd revision of the last change under the prefix: the largest
mod_revision of the keys present, then the revision of every later event (a put, or a
delete when a member leaves or its lease lapses). Every member sees the same events in
the same order, so every member computes the same epoch. A member that loses etcd keeps
its last view, marked stale, and rejoins (a new lease if the old one lapsed) when it can.

One id, one member: the key is written only in a transaction that finds it
absent or held by our own lease. At start (`join`, before the node serves) a key held by
another lease is waited on for that lease's remaining TTL plus a margin: a crashed
incarnation's lease lapses by then and the restart proceeds, while a live member renews
its lease every TTL/3 and keeps the key, so the second process refuses to start with
ConfigError naming member_id. A member whose own lease lapsed and finds its id taken when
it rejoins does not take it back: it logs that and keeps its last view, marked stale.
If etcd cannot be reached at start, nothing is checked then; `run` claims the key the same
way when etcd comes back.
"""

from __future__ import annotations

import asyncio
import json
import logging

from mesh.errors import ConfigError, MeshError, PeerError
from mesh.membership._etcd_client import EtcdClient, WatchEvent
from mesh.membership._source import MembershipView, Publish

__all__ = ["EtcdMembership"]

log = logging.getLogger("mesh.membership")
# Past a holder's remaining TTL: etcd expires leases on its own timer (about every 0.5 s).
CLAIM_MARGIN_S = 1.5


class EtcdMembership:
    def __init__(
        self,
        client: EtcdClient,
        *,
        prefix: str,
        member_id: str,
        addr: str,
        lease_ttl_s: int,
        retry_s: float = 0.2,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.member_id = member_id
        self.addr = addr
        self.lease_ttl_s = lease_ttl_s
        self.retry_s = retry_s
        self.lease = 0
        self.view = MembershipView()
        self.last_error = ""
        self._publish: Publish = lambda v: None
        self._left = False

    @property
    def key(self) -> str:
        return f"{self.prefix}{self.member_id}"

    async def join(self) -> None:
        """Claim our key before the node serves; ConfigError if a live member holds it.

        Bounded by the holder's remaining lease TTL plus CLAIM_MARGIN_S. etcd unreachable:
        returns, and `run` joins (and claims) when it can.
        """
        loop = asyncio.get_running_loop()
        value = json.dumps({"addr": self.addr})
        try:
            self.lease = await self.client.grant(self.lease_ttl_s)
            deadline = None
            while True:
                holder = await self.client.claim(self.key, value, lease=self.lease)
                if holder == 0:
                    return
                if deadline is None:
                    ttl = await self.client.lease_ttl(holder) if holder > 0 else 0
                    deadline = loop.time() + max(ttl, 0) + CLAIM_MARGIN_S
                if holder < 0 or loop.time() >= deadline:
                    break
                await asyncio.sleep(min(0.25, self.lease_ttl_s / 4))
                if await self.client.keepalive(self.lease) <= 0:  # ours, while we wait
                    self.lease = await self.client.grant(self.lease_ttl_s)
        except PeerError as exc:
            self.last_error = str(exc)
            log.warning("etcd membership: %s; joining when etcd answers", exc)
            return
        await self._give_up_lease()
        raise self._taken(holder)

    def _taken(self, holder: int) -> ConfigError:
        return ConfigError(
            "member_id",
            f"{self.member_id!r} is already held in etcd ({self.key}) by another live "
            f"member (lease {holder:x}); give each process its own member_id "
            "(or member_id_env, or leave both unset for a per-process id)",
        )

    async def _give_up_lease(self) -> None:
        lease, self.lease = self.lease, 0
        if lease:
            try:
                await self.client.revoke(lease)
            except PeerError:
                pass  # it lapses on its own

    async def run(self, publish: Publish) -> None:
        self._publish = publish
        while True:
            try:
                await self._session()
            except MeshError as exc:
                self.last_error = str(exc)
                log.warning("etcd membership: %s", exc)
            except (KeyError, ValueError) as exc:
                self.last_error = f"etcd answered unexpectedly: {exc!r}"
            except Exception as exc:  # never stop following membership: log and retry
                self.last_error = repr(exc)
                log.exception("etcd membership failed")
            if self.view.members and not self.view.stale:
                self._emit(MembershipView(self.view.members, self.view.epoch, True))
            await asyncio.sleep(self.retry_s)

    async def _session(self) -> None:
        """Join (or re-join), publish the ring, follow the watch until something fails."""
        if self._left:
            await asyncio.Event().wait()
        fresh = False
        if not self.lease or await self.client.keepalive(self.lease) <= 0:
            self.lease = await self.client.grant(self.lease_ttl_s)
            fresh = True
        value = json.dumps({"addr": self.addr})
        _, kvs = await self.client.range_prefix(self.prefix)
        mine = (self.key, value, self.lease)
        if fresh or not any((kv.key, kv.value, kv.lease) == mine for kv in kvs):
            # Join (or re-join). Reconnecting with our key still there (an etcd restart,
            # a brief partition) writes nothing, so the ring and its epoch stay as they were.
            holder = await self.client.claim(self.key, value, lease=self.lease)
            if holder:
                raise self._taken(holder)  # logged by run(); our view stays, marked stale
            _, kvs = await self.client.range_prefix(self.prefix)
        members = {kv.key[len(self.prefix) :]: _addr(kv.value) for kv in kvs}
        epoch = max((kv.mod_revision for kv in kvs), default=0)
        self._emit(MembershipView(members, max(epoch, self.view.epoch), False))
        keepalive = asyncio.get_running_loop().create_task(self._keepalive())
        watch = asyncio.get_running_loop().create_task(self._follow(epoch + 1, members))
        try:
            done, _ = await asyncio.wait({keepalive, watch}, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # re-raise what ended the session
        finally:
            keepalive.cancel()
            watch.cancel()

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            if await self.client.keepalive(self.lease) <= 0:
                self.lease = 0
                raise _LeaseLost("membership.lease", "lapsed; joining again")

    async def _follow(self, start_revision: int, members: dict[str, str]) -> None:
        epoch = self.view.epoch
        async for events in self.client.watch(self.prefix, start_revision):
            members = dict(members)
            for ev in events:
                self._apply(members, ev)
                epoch = max(epoch, ev.kv.mod_revision)
            self._emit(MembershipView(members, epoch, False))

    def _apply(self, members: dict[str, str], ev: WatchEvent) -> None:
        mid = ev.kv.key[len(self.prefix) :]
        if ev.deleted:
            members.pop(mid, None)
        else:
            members[mid] = _addr(ev.kv.value)

    def _emit(self, view: MembershipView) -> None:
        self.view = view
        self._publish(view)

    async def leave(self) -> None:
        """Delete our key and revoke the lease, so the ring drops us at once."""
        self._left = True
        try:
            await self.client.delete(self.key)
            if self.lease:
                await self.client.revoke(self.lease)
        except MeshError as exc:
            log.warning("etcd leave: %s (the lease will lapse instead)", exc)

    async def close(self) -> None:
        await self.client.close()


class _LeaseLost(MeshError):
    pass


def _addr(value: str) -> str:
    try:
        obj = json.loads(value)
    except ValueError:
        return value
    return str(obj.get("addr", "")) if isinstance(obj, dict) else value

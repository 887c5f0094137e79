"""Membership from etcd v3: each member keeps a lease-backed key under a prefix and
watches the prefix.

The ring epoch is the etcd revision of the last change under the prefix: the largest
mod_revision of the keys present, then the revision of every later event (a put, or a
delete when a member leaves or its lease lapses). Every member sees the same events in
the same order, so every member computes the same epoch. A member that loses etcd keeps
its last view, marked stale, and rejoins (a new lease if the old one lapsed) when it can.
"""

from __future__ import annotations

import asyncio
import json
import logging

from mesh.errors import MeshError
from mesh.membership._etcd_client import EtcdClient, WatchEvent
from mesh.membership._source import MembershipView, Publish

__all__ = ["EtcdMembership"]

log = logging.getLogger("mesh.membership")


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
        if fresh or not any(kv.key == self.key and kv.value == value for kv in kvs):
            # Join (or re-join). Reconnecting with our key still there (an etcd restart,
            # a brief partition) writes nothing, so the ring and its epoch stay as they were.
            await self.client.put(self.key, value, lease=self.lease)
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

"""The gRPC Transport: a PeerServer for streams others open to us, a PeerLink per owner.

Routing follows the protocol's direction: report batches go out on our link to the
owner; snapshot batches go back on the streams their receiver opened to us (every live
one), so only active reporters (who hold a stream) get them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import grpc

from mesh.config import TlsConfig
from mesh.core.messages import CellPublish, CooldownReport, Handover, Message, ReportBatch, encode
from mesh.core.messages._slots import SlotReports
from mesh.peer._link import PeerLink
from mesh.peer._server import IsMember, PeerHandler, PeerServer
from ratemesh.checks import with_port

__all__ = ["GrpcTransport"]

log = logging.getLogger("mesh.peer")


class GrpcTransport:
    def __init__(
        self,
        handler: PeerHandler,
        *,
        member_id: str,
        worker_epoch: int,
        listen: str,
        advertise: str | None,
        tls: TlsConfig | None,
        max_message_bytes: int,
        extra_handlers: tuple[grpc.GenericRpcHandler, ...] = (),
        fleet_secret: bytes | None = None,
        fleet_secrets_accepted: tuple[bytes, ...] = (),
        is_member: IsMember | None = None,
    ) -> None:
        self.handler = handler
        self.member_id = member_id
        self.worker_epoch = worker_epoch
        self.listen = listen
        self.advertise = advertise
        self.tls = tls
        self.max_message_bytes = max_message_bytes
        self.fleet_secret = fleet_secret
        self.server = PeerServer(
            handler,
            listen,
            tls=tls,
            max_message_bytes=max_message_bytes,
            extra_handlers=extra_handlers,
            member_id=member_id,
            fleet_secrets=fleet_secrets_accepted or ((fleet_secret,) if fleet_secret else ()),
            is_member=is_member,
        )
        self.links: dict[str, PeerLink] = {}
        self._addresses: dict[str, str] = {}
        self.sent = 0
        self.dropped = 0
        self.bad_replies = 0  # of links since closed (the live ones count their own)

    async def start(self) -> str:
        port = await self.server.start()
        if self.advertise:
            return self.advertise
        return with_port(self.listen, port)

    def set_peers(self, addresses: Mapping[str, str]) -> None:
        self._addresses = dict(addresses)
        for peer, link in list(self.links.items()):
            if self._addresses.get(peer) != link.addr:
                del self.links[peer]
                self.bad_replies += link.bad_replies
                asyncio.get_running_loop().create_task(link.close())

    def send(self, to: str, message: Message) -> bool:
        data = encode(message)
        if isinstance(message, (ReportBatch, Handover, CellPublish, CooldownReport, SlotReports)):
            link = self.links.get(to)
            if link is None:
                addr = self._addresses.get(to)
                if addr is None:
                    self.dropped += 1
                    return False
                link = self.links[to] = PeerLink(
                    member_id=self.member_id,
                    worker_epoch=self.worker_epoch,
                    peer_id=to,
                    addr=addr,
                    deliver=self.handler.deliver,
                    tls=self.tls,
                    max_message_bytes=self.max_message_bytes,
                    on_reset=self.handler.link_reset,
                    fleet_secret=self.fleet_secret,
                )
            ok = link.send(data)
        else:
            ok = self.server.send(to, data)
        if ok:
            self.sent += 1
        else:
            self.dropped += 1
        return ok

    async def flush(self, timeout_s: float) -> bool:
        """Wait (bounded) until what is queued on our links now has been written to their
        streams, even on a link still connecting (a leaving member's hand-over); True if
        all of it was."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        due = {link: link.sent + link.queue.qsize() for link in self.links.values()}
        while any(link.sent < n for link, n in due.items()):
            if loop.time() >= until:
                return False
            await asyncio.sleep(0.005)
        return True

    async def close(self, drain_s: float) -> None:
        """Stop accepting streams, let links drain (bounded), then cancel everything."""
        self.server.accepting = False
        links = list(self.links.values())
        if links:
            await asyncio.gather(*(link.drain(drain_s) for link in links))
        grace_s = min(drain_s, 0.2)
        try:  # bounded: a stream stuck in grpc must not keep the member from stopping
            await asyncio.wait_for(self.server.stop(grace_s), grace_s + 1.0)
        except TimeoutError:
            log.warning("peer server did not stop within %.1f s", grace_s + 1.0)
        await asyncio.gather(*(link.close() for link in links))
        self.links.clear()

    def stats(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "dropped": self.dropped + sum(lk.dropped for lk in self.links.values()),
            "received": self.server.received,
            "refused_streams": self.server.refused,
            # ratemesh_peer_bad_replies_total: monotonic, closed links' counts kept
            "bad_replies": self.bad_replies + sum(lk.bad_replies for lk in self.links.values()),
            "refused": dict(self.server.refused_by),  # ratemesh_peer_refused_total{reason}
            "open_streams": self.server.open_streams,
            "snapshots_dropped_no_stream": self.server.snapshots_dropped,
            "displaced_streams": self.server.displaced,  # silent ones, for a newer stream
            "links": {
                p: {"addr": lk.addr, "connected": lk.connected, "last_error": lk.last_error}
                for p, lk in sorted(self.links.items())
            },
            "inbound_streams": self.server.streams(),
        }

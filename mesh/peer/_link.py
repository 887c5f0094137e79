"""One member's long-lived stream to one peer: reports out, snapshots back.

The link reconnects with backoff for as long as the peer is in the ring. What is queued
while it is down may be lost; the reporter resends unacknowledged reports with the same
worker_epoch and sequence, so loss costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc
from grpc import aio

from mesh.config import TlsConfig
from mesh.core.messages import CellFold, CooldownNotice, Message, SnapshotBatch, decode
from mesh.core.messages._slots import SlotGrants
from mesh.errors import MessageError, PeerRefused
from mesh.peer._identity import AUTH_MD, sign
from mesh.peer._tls import channel_credentials
from mesh.peer._wire import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA, SCHEMA_MD, channel_options
from mesh.peer._wire import translate as translate_error

__all__ = ["PeerLink", "LINK_QUEUE_MAX", "open_channel"]

log = logging.getLogger("mesh.peer")
LINK_QUEUE_MAX = 1024  # report batches waiting for the stream; beyond it they are dropped
BACKOFF_MIN_S = 0.02
BACKOFF_MAX_S = 0.5


def open_channel(addr: str, tls: TlsConfig | None, max_message_bytes: int) -> aio.Channel:
    options = channel_options(max_message_bytes)
    if tls is None:
        return aio.insecure_channel(addr, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return aio.secure_channel(addr, channel_credentials(tls), options=options)


class PeerLink:
    def __init__(
        self,
        *,
        member_id: str,
        worker_epoch: int,
        peer_id: str,
        addr: str,
        deliver: Callable[[Message], None],
        tls: TlsConfig | None,
        max_message_bytes: int,
        on_reset: Callable[[str], None] | None = None,
        fleet_secret: bytes | None = None,
    ) -> None:
        self.member_id = member_id
        self.worker_epoch = worker_epoch
        self.peer_id = peer_id
        self.addr = addr
        self.deliver = deliver
        self.on_reset = on_reset  # told when a stream opens after one failed or ended
        self.resets = 0
        self.tls = tls
        self.max_message_bytes = max_message_bytes
        self.fleet_secret = fleet_secret  # proves membership to the peer (module _identity)
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(LINK_QUEUE_MAX)
        self.connected = False
        self.sent = 0
        self.dropped = 0
        self.bad_replies = 0
        self.last_error = ""
        self._channel = open_channel(addr, tls, max_message_bytes)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def send(self, data: bytes) -> bool:
        if self.queue.full():
            self.dropped += 1
            return False
        self.queue.put_nowait(data)
        return True

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) until what is queued has been handed to the stream."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        while not self.queue.empty() and self.connected and loop.time() < until:
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        await self._channel.close(None)

    async def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        broken = False  # a stream failed or ended since the last one opened
        while True:
            call = self._channel.stream_stream(EXCHANGE)(metadata=self._metadata())
            writer = asyncio.get_running_loop().create_task(self._write(call))
            try:
                # the peer's headers: it admitted the stream (they come at once), or refused it
                await call.initial_metadata()
                if call.done():  # refused at open: reading raises the peer's status
                    await call.read()
                else:
                    self.connected = True
                    if broken and self.on_reset is not None:
                        self.resets += 1
                        self.on_reset(self.peer_id)  # what the old stream carried may be lost
                    broken = False
                    backoff = BACKOFF_MIN_S
                    while (data := await call.read()) is not aio.EOF:
                        self._take(data)
                        await asyncio.sleep(0)  # a turn of the loop between two batches
            except grpc.RpcError as exc:
                err = translate_error(exc, f"peer {self.peer_id}")
                if isinstance(err, PeerRefused):  # warned once per distinct refusal
                    log.log(
                        logging.DEBUG if str(err) == self.last_error else logging.WARNING, "%s", err
                    )
                self.last_error = str(err)
            except Exception as exc:  # a bug must not end the link for good: log, retry
                self.last_error = repr(exc)
                log.exception("peer %s: link failed", self.peer_id)
            finally:
                self.connected = False
                broken = True
                writer.cancel()
                call.cancel()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The stream's metadata; a fresh fleet-secret proof for every attempt (a proof is
        good once, within the skew window)."""
        md = (
            (MEMBER_MD, self.member_id),
            (SCHEMA_MD, SCHEMA),
            (EPOCH_MD, str(self.worker_epoch)),
        )
        if self.fleet_secret is None:
            return md
        proof = sign(
            self.fleet_secret,
            member=self.member_id,
            epoch=str(self.worker_epoch),
            schema=SCHEMA,
            target=self.peer_id,
            now_s=int(time.time()),
        )
        return (*md, (AUTH_MD, proof))

    def _take(self, data: bytes) -> None:
        try:
            msg = decode(data, max_bytes=self.max_message_bytes)
        except MessageError as exc:
            self.bad_replies += 1  # a bad reply changes nothing; the reporter retries
            self.last_error = str(exc)
            return
        if isinstance(msg, SnapshotBatch):
            self.deliver(msg)
        elif isinstance(msg, (CellFold, CooldownNotice, SlotGrants)) and msg.sender == self.peer_id:
            self.deliver(msg)  # the owner's fold of our cells, from the peer we dialled
        else:
            self.bad_replies += 1

    async def _write(self, call: aio.StreamStreamCall[bytes, bytes]) -> None:
        try:
            while True:
                data = await self.queue.get()
                await call.write(data)
                self.sent += 1
        except Exception:  # noqa: BLE001 - any failure to write ends this call only
            pass  # the reader sees the failure and reconnects

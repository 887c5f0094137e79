"""The peer service every worker runs: reports arrive on long-lived streams, snapshots go
back on the stream their receiver opened (so they reach active reporters only).

Every request is decoded and validated before anything sees it. A malformed message, one
from a different sender than the stream's, or one of another schema or worker_epoch ends
the stream with a clear status (INVALID_ARGUMENT / FAILED_PRECONDITION) and changes
nothing; an oversized one is refused by grpc itself (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc
from grpc import aio

from mesh.config import TlsConfig
from mesh.core.messages import Handover, Message, ReportBatch, decode
from mesh.errors import ConfigError, MessageError
from mesh.peer._tls import server_credentials
from mesh.peer._wire import (
    EPOCH_MD,
    MEMBER_MD,
    PEER_SERVICE,
    SCHEMA,
    SCHEMA_MD,
    channel_options,
    pack,
)
from ratemesh.operator import probe_bind

__all__ = ["PeerHandler", "PeerServer", "STREAM_QUEUE_MAX"]

log = logging.getLogger("mesh.peer")
STREAM_QUEUE_MAX = 1024  # snapshot batches waiting for one receiver's stream; then dropped


class PeerHandler(Protocol):
    def deliver(self, message: Message) -> None: ...

    def link_reset(self, peer: str) -> None: ...

    def status(self) -> dict[str, Any]: ...


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class PeerServer:
    """grpc aio server with generic handlers; bytes in, bytes out, the codec is ours."""

    def __init__(
        self,
        handler: PeerHandler,
        listen: str,
        *,
        tls: TlsConfig | None,
        max_message_bytes: int,
        extra_handlers: tuple[grpc.GenericRpcHandler, ...] = (),
    ) -> None:
        self.handler = handler
        self.listen = listen
        self.tls = tls
        self.max_message_bytes = max_message_bytes
        self._extra = extra_handlers
        self._server: aio.Server | None = None
        self._streams: dict[str, asyncio.Queue[bytes]] = {}
        self.accepting = True
        self.refused = 0  # streams ended for a bad message
        self.received = 0
        self.snapshots_dropped = 0

    async def start(self) -> int:
        # grpc sets SO_REUSEPORT by default: a second node on this port would bind beside
        # the first and take half its peers' streams; refused, it fails with `listen`
        options = [*channel_options(self.max_message_bytes), ("grpc.so_reuseport", 0)]
        server = aio.server(options=options)
        rpc: dict[str, grpc.RpcMethodHandler] = {
            "Exchange": grpc.stream_stream_rpc_method_handler(self._exchange),
            "Status": grpc.unary_unary_rpc_method_handler(self._status),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(PEER_SERVICE, rpc), *self._extra)
        )
        try:
            probe_bind(self.listen, error=ConfigError)
            if self.tls is not None:
                port = server.add_secure_port(self.listen, server_credentials(self.tls))
            else:
                port = server.add_insecure_port(self.listen)
        except ConfigError:
            await server.stop(None)
            raise
        except RuntimeError as exc:  # grpc's "Failed to bind to address ..."; the probe
            await server.stop(None)  # lost a race
            raise ConfigError(
                "listen",
                f"cannot serve on {self.listen}: the port is in use or "
                "the address is not this host's",
            ) from exc
        await server.start()
        self._server = server
        return int(port)

    def send(self, member: str, data: bytes) -> bool:
        """Queue a snapshot batch on `member`'s stream; False if it has none (or it is full)."""
        q = self._streams.get(member)
        if q is None or q.full():
            self.snapshots_dropped += 1
            return False
        q.put_nowait(data)
        return True

    def streams(self) -> list[str]:
        return sorted(self._streams)

    async def stop(self, grace_s: float) -> None:
        """Refuse new streams, give open ones `grace_s` to finish, then cancel them."""
        self.accepting = False
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    # -- handlers -------------------------------------------------------------------------

    async def _status(self, request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        return pack(self.handler.status())

    def _open(self, context: aio.ServicerContext[bytes, bytes]) -> tuple[str, int]:
        if not self.accepting:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, "member is shutting down")
        md = {k: v for k, v in (context.invocation_metadata() or ())}
        if md.get(SCHEMA_MD) != SCHEMA:
            raise _Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"schema: unsupported schema version {md.get(SCHEMA_MD)!r}; "
                f"this peer speaks {SCHEMA}",
            )
        member, epoch = md.get(MEMBER_MD), md.get(EPOCH_MD)
        if not isinstance(member, str) or not member or len(member) > 256:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{MEMBER_MD}: metadata is required (the sending member's id)",
            )
        if not isinstance(epoch, str) or not epoch.isdigit():
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{EPOCH_MD}: metadata is required (the sender's worker_epoch)",
            )
        return member, int(epoch)

    def _check(self, data: bytes, member: str, epoch: int) -> Message:
        try:
            msg = decode(data, max_bytes=self.max_message_bytes)
        except MessageError as exc:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        if isinstance(msg, Handover):  # a leaving owner's keys; the owner checks the rest
            if msg.sender != member:
                raise _Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"sender: {msg.sender!r} is not this stream's member {member!r}",
                )
            return msg
        if not isinstance(msg, ReportBatch):
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "kind: only report batches and hand-overs may be sent on this stream",
            )
        if msg.sender != member:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"sender: {msg.sender!r} is not this stream's member {member!r}",
            )
        if msg.worker_epoch != epoch:
            raise _Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"worker_epoch: {msg.worker_epoch} is not this stream's worker_epoch {epoch}",
            )
        return msg

    async def _exchange(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext[bytes, bytes]
    ) -> None:
        try:
            member, epoch = self._open(context)
        except _Refused as exc:
            await context.abort(exc.code, exc.details)
            return
        queue: asyncio.Queue[bytes] = asyncio.Queue(STREAM_QUEUE_MAX)
        self._streams[member] = queue
        writer = asyncio.get_running_loop().create_task(_write(queue, context.write))
        refused: _Refused | None = None
        try:
            async for data in requests:
                try:
                    msg = self._check(data, member, epoch)
                except _Refused as exc:
                    refused = exc
                    break
                self.received += 1
                self.handler.deliver(msg)
        finally:
            writer.cancel()
            if self._streams.get(member) is queue:
                del self._streams[member]
        if refused is not None:
            self.refused += 1
            log.warning("peer %s refused: %s", member, refused.details)
            await context.abort(refused.code, refused.details)


async def _write(queue: asyncio.Queue[bytes], write: Callable[[bytes], Any]) -> None:
    try:
        while True:
            data = await queue.get()
            await write(data)
    except Exception:  # noqa: BLE001 - the stream ended under us; its reader finishes it
        return

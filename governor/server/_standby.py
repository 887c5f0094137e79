"""What a governord that does not lead answers: every call, UNAVAILABLE naming the leader.

A standby (or a process still campaigning) binds its addresses like a leader, so a client that
reaches it learns where to go (``reason: not_leader`` and ``leader: host:port`` in governord's
detail map, docs/failover.md) instead of timing out. ``Switch`` is the one gRPC handler the
server holds: it answers as a standby until the process leads, then hands every call to the
real services. Nothing here reads the engine: a standby has none yet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from grpc import aio

from governor import wire
from ratemesh import coordinator as cw

__all__ = ["NotLeader", "Switch"]

_COORDINATOR_STREAMS = {"Watch"}


class NotLeader:
    """Answers for a process that does not lead; ``leader()`` is who does, as last seen."""

    def __init__(self, leader: Callable[[], tuple[str, int]]) -> None:
        self._leader = leader

    def detail(self) -> dict[str, Any]:
        address, epoch = self._leader()
        where = address or "unknown (an election is under way)"
        return {
            "reason": wire.NOT_LEADER,
            "message": f"not the leader: the leader is {where}",
            "leader": address,
            "epoch": epoch,
        }

    async def refuse(self, context: aio.ServicerContext[Any, Any]) -> None:
        d = self.detail()
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, d["message"], ((wire.ERROR_MD, wire.pack(d)),)
        )

    def handler(self, method: str) -> grpc.RpcMethodHandler | None:
        """A refusing handler shaped like the method (unary, server stream, bidi)."""
        service, _, name = method.lstrip("/").partition("/")

        async def unary(_req: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
            await self.refuse(context)
            raise AssertionError("unreachable: abort raises")

        async def stream(
            _req: bytes, context: aio.ServicerContext[bytes, bytes]
        ) -> AsyncIterator[bytes]:
            await self.refuse(context)
            yield b""  # pragma: no cover - abort raises

        async def bidi(
            _reqs: AsyncIterator[bytes], context: aio.ServicerContext[bytes, bytes]
        ) -> AsyncIterator[bytes]:
            await self.refuse(context)
            yield b""  # pragma: no cover - abort raises

        if service == wire.SERVICE:
            if name == wire.MULTIPLEX:
                return grpc.stream_stream_rpc_method_handler(bidi)
            spec = wire.METHODS.get(name)
            if spec is None:
                return None
            if spec.stream:
                return grpc.unary_stream_rpc_method_handler(stream)
            return grpc.unary_unary_rpc_method_handler(unary)
        if service == cw.COORDINATOR_SERVICE:
            if name in _COORDINATOR_STREAMS:
                return grpc.unary_stream_rpc_method_handler(stream)
            return grpc.unary_unary_rpc_method_handler(unary)
        return None


class Switch(grpc.GenericRpcHandler):  # type: ignore[misc]
    """The server's handler: a standby's refusals until ``lead(handlers)``, then those."""

    def __init__(self, standby: NotLeader) -> None:
        self._standby = standby
        self._handlers: Sequence[grpc.GenericRpcHandler] = ()

    def lead(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._handlers = tuple(handlers)

    @property
    def leading(self) -> bool:
        return bool(self._handlers)

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        for h in self._handlers:
            found = h.service(handler_call_details)
            if found is not None:
                return found
        if self._handlers:
            return None
        return self._standby.handler(handler_call_details.method)

"""Stand-ins for the other governords of a highly available record, for the clients' tests:
real gRPC servers on 127.0.0.1:0 that speak governord's wire contract for a non-leader.

``Standby(leader)`` answers every call of governord's service (unary, Multiplex, WatchNode)
and of the coordinator service UNAVAILABLE, "not the leader: the leader is <addr>", with the
detail map ``{reason: not_leader, message, leader, epoch}`` in ``wire.ERROR_MD``.

``Relay(leader)`` passes governord calls through to a real governord and returns its answers,
as a leader would, until ``deposed`` is set: from then on it still passes each call through
(the effect happens) but answers it as a deposed leader would (not_leader, per call on
Multiplex). That is the call that straddles a takeover: applied, its reply lost, resent.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from governor import wire
from governor.server._standby import NotLeader
from ratemesh.coordinator import COORDINATOR_SERVICE

__all__ = ["Relay", "Standby"]

_STREAMS = {"WatchNode", "Watch"}  # server-streaming methods of the two services


class _Fake:
    """A server on 127.0.0.1:0 that counts calls by method name."""

    def __init__(self, leader: str, epoch: int = 7) -> None:
        self.leader = leader
        self.epoch = epoch
        self.calls: collections.Counter[str] = collections.Counter()
        self.addr = ""
        self._server: aio.Server | None = None
        # governord's own refusals, naming this stand-in's leader
        self.not_leader = NotLeader(lambda: (self.leader, self.epoch))

    @property
    def refused(self) -> int:
        """Calls of every method it saw."""
        return sum(self.calls.values())

    def handler(self, method: str) -> grpc.RpcMethodHandler | None:
        """The handler for ``/service/Name``."""
        raise NotImplementedError

    async def start(self) -> str:
        fake = self

        class Handler(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc is untyped
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
                service, _, name = details.method.lstrip("/").partition("/")
                if service not in (wire.SERVICE, COORDINATOR_SERVICE):
                    return None
                fake.calls[name] += 1
                return fake.handler(details.method)

        self._server = aio.server()
        self._server.add_generic_rpc_handlers((Handler(),))
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.addr = f"127.0.0.1:{port}"
        return self.addr

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None


class Standby(_Fake):
    """Every call: UNAVAILABLE not_leader naming ``leader``, as governord's standby answers."""

    def handler(self, method: str) -> grpc.RpcMethodHandler | None:
        return self.not_leader.handler(method)


class Relay(_Fake):
    """governord's unary calls and Multiplex, passed through to ``leader``; ``deposed``: the
    effect still happens there, but the answer is not_leader (see the module doc)."""

    def __init__(self, leader: str, epoch: int = 7) -> None:
        super().__init__(leader, epoch)
        self.deposed = False
        self.relayed: collections.Counter[str] = collections.Counter()  # passed through
        self._channel: aio.Channel | None = None

    async def start(self) -> str:
        self._channel = aio.insecure_channel(self.leader)
        return await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._channel is not None:
            await self._channel.close()

    async def _pass(
        self, method: str, body: bytes, md: tuple[tuple[str, str], ...]
    ) -> tuple[str, Any]:
        """The leader's answer: ("reply", map) or (code name, detail map)."""
        assert self._channel is not None
        self.relayed[method] += 1
        try:
            reply = await self._channel.unary_unary(wire.path(method))(body, metadata=md)
        except grpc.aio.AioRpcError as err:
            detail: dict[str, Any] = {}
            for k, v in err.trailing_metadata() or ():
                if k == wire.ERROR_MD:
                    detail = wire.unpack(v)
            return err.code().name, detail or {"message": err.details() or ""}
        return "reply", wire.unpack(reply)

    def handler(self, method: str) -> grpc.RpcMethodHandler | None:
        name = method.rpartition("/")[2]

        async def unary(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
            md = _md(context)
            kind, answer = await self._pass(name, request, md)
            if self.deposed:
                await self.not_leader.refuse(context)
            if kind != "reply":
                out = ((wire.ERROR_MD, wire.pack(answer)),)
                await context.abort(grpc.StatusCode[kind], str(answer.get("message")), out)
            return wire.pack(answer)

        async def mux(
            requests: AsyncIterator[bytes], context: aio.ServicerContext[bytes, bytes]
        ) -> AsyncIterator[bytes]:
            md = _md(context)
            async for data in requests:
                replies = []
                for call in wire.unpack(data)["calls"]:
                    kind, answer = await self._pass(call["method"], call["body"], md)
                    if self.deposed:
                        kind, answer = "UNAVAILABLE", self.not_leader.detail()
                    if kind == "reply":
                        replies.append({"id": call["id"], "reply": answer})
                    else:
                        replies.append({"id": call["id"], "code": kind, "error": answer})
                for out in wire.pack_batch("replies", replies):
                    yield out

        if name == wire.MULTIPLEX:
            return grpc.stream_stream_rpc_method_handler(mux)
        if name in _STREAMS:
            return None  # not needed by the tests
        return grpc.unary_unary_rpc_method_handler(unary)


def _md(context: aio.ServicerContext[bytes, bytes]) -> tuple[tuple[str, str], ...]:
    """The caller's credentials, to present to the leader as its own."""
    keep = (wire.KEY_MD, wire.TOKEN_MD)
    return tuple((k, v) for k, v in context.invocation_metadata() or () if k in keep)

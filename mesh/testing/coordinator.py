"""An in-process coordinator on its own port, for tests and `mesh bench policy --in-process`:
the coordinator API (put, list, watch) over gRPC, served from a `PolicyStore`.

No auth and not durable: governord serves the same API for real (docs/policies.md), and
`mesh.peer.CoordinatorClient` speaks to either. It lives here, beside the other harnesses,
because the node never serves it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from grpc import aio

from mesh.coordinator import PolicyStore
from mesh.core.messages import MAX_MESSAGE_BYTES
from mesh.errors import ConfigError, MessageError
from mesh.peer._wire import pack, server_options, unpack
from ratemesh import callguard
from ratemesh.checks import with_port
from ratemesh.coordinator import COORDINATOR_SERVICE

__all__ = ["CoordinatorServer", "coordinator_handler"]


def coordinator_handler(store: PolicyStore) -> grpc.GenericRpcHandler:
    """Generic handlers serving `store`; add them to any grpc aio server."""

    async def put(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        try:
            obj = unpack(request, "put")
            body = obj.get("policy") if isinstance(obj, dict) else None
            if not isinstance(body, dict):
                raise MessageError("policy", "must be a mapping")
            policy = store.put(body)
        except (ConfigError, MessageError, TypeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable") from exc
        return pack({"policy": policy.to_dict(), "revision": store.revision, "created": True})

    async def list_(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        return pack(store.snapshot().to_wire())

    async def watch(
        request: bytes, context: aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        try:
            obj = unpack(request, "watch")
            after = obj.get("after_revision", 0) if isinstance(obj, dict) else None
            if type(after) is not int or after < 0:
                raise MessageError("after_revision", "must be an integer >= 0")
        except MessageError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        async for snap in store.watch(after):
            yield pack(snap.to_wire())

    return grpc.method_handlers_generic_handler(
        COORDINATOR_SERVICE,
        {
            "Put": grpc.unary_unary_rpc_method_handler(put),
            "List": grpc.unary_unary_rpc_method_handler(list_),
            "Watch": grpc.unary_stream_rpc_method_handler(watch),
        },
    )


class CoordinatorServer:
    """A standalone in-process coordinator on its own port (tests, bench, demos)."""

    def __init__(self, store: PolicyStore, listen: str = "127.0.0.1:0") -> None:
        self.store = store
        self.listen = listen
        self._server: aio.Server | None = None
        self.addr = ""

    async def start(self) -> str:
        # no credential (a test or demo store on loopback), but the guard's bounds: calls
        # at once, a request within FIRST_MESSAGE_S, streams a connection
        guard = callguard.CallGuard(lambda method, md, context: callguard.Caller("anyone"))
        options = server_options(MAX_MESSAGE_BYTES) + callguard.server_options()
        self._server = aio.server(options=options, interceptors=(guard,))
        self._server.add_generic_rpc_handlers((coordinator_handler(self.store),))
        port = self._server.add_insecure_port(self.listen)
        await self._server.start()
        self.addr = with_port(self.listen, port)
        return self.addr

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

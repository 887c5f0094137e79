"""The coordinator API over gRPC (put a policy as a new generation, list, watch), and the
client that implements `PolicySource` against it. governord will serve the same methods."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from mesh.config import TlsConfig
from mesh.coordinator import PolicySnapshot, PolicyStore
from mesh.core.messages import MAX_MESSAGE_BYTES
from mesh.core.policy import TenantRatePolicy
from mesh.errors import ConfigError, MessageError
from mesh.peer._link import open_channel
from mesh.peer._wire import pack, server_options, translate, unpack

__all__ = ["COORDINATOR_SERVICE", "coordinator_handler", "CoordinatorClient", "CoordinatorServer"]

COORDINATOR_SERVICE = "ratemesh.coordinator.v1.Coordinator"


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
        return pack({"policy": policy.to_dict(), "revision": store.revision})

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
        self._server = aio.server(options=server_options(MAX_MESSAGE_BYTES))
        self._server.add_generic_rpc_handlers((coordinator_handler(self.store),))
        port = self._server.add_insecure_port(self.listen)
        await self._server.start()
        self.addr = f"{self.listen.rpartition(':')[0]}:{port}"
        return self.addr

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None


class CoordinatorClient:
    """`PolicySource` over gRPC. Errors arrive as PeerUnavailable/PeerRefused."""

    def __init__(self, addr: str, *, tls: TlsConfig | None = None, timeout_s: float = 2.0) -> None:
        self.addr = addr
        self.timeout_s = timeout_s
        self._channel = open_channel(addr, tls, MAX_MESSAGE_BYTES)

    def _method(self, name: str) -> str:
        return f"/{COORDINATOR_SERVICE}/{name}"

    async def put(self, policy: dict[str, Any] | TenantRatePolicy) -> TenantRatePolicy:
        body = policy.to_dict() if isinstance(policy, TenantRatePolicy) else policy
        try:
            data = await self._channel.unary_unary(self._method("Put"))(
                pack({"policy": body}), timeout=self.timeout_s
            )
        except grpc.RpcError as exc:
            raise translate(exc, "coordinator.put") from exc
        obj = unpack(data, "put")
        return TenantRatePolicy.from_dict(obj.get("policy"), where="policy", error=MessageError)

    async def list(self) -> PolicySnapshot:
        try:
            data = await self._channel.unary_unary(self._method("List"))(
                pack({}), timeout=self.timeout_s
            )
        except grpc.RpcError as exc:
            raise translate(exc, "coordinator.list") from exc
        return PolicySnapshot.from_wire(unpack(data, "list"))

    async def watch(self, after_revision: int) -> AsyncIterator[PolicySnapshot]:
        call = self._channel.unary_stream(self._method("Watch"))(
            pack({"after_revision": after_revision})
        )
        try:
            async for data in call:
                yield PolicySnapshot.from_wire(unpack(data, "watch"))
        except grpc.RpcError as exc:
            raise translate(exc, "coordinator.watch") from exc
        finally:
            call.cancel()

    async def close(self) -> None:
        await self._channel.close(None)

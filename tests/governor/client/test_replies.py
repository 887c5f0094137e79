"""A reply from the server that is not a map (or not msgpack) is refused with a RequestError
naming the call, not trusted or asserted: a real gRPC server on loopback answers wrongly."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from governor import wire
from governor.client import Client, RequestError


async def _serve(reply: bytes) -> tuple[aio.Server, str]:
    async def answer(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        return reply

    class Handler(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc is untyped
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            return grpc.unary_unary_rpc_method_handler(answer)

    server = aio.server()
    server.add_generic_rpc_handlers((Handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize(
    "reply, problem",
    [(wire.pack([1, 2]), "bad OpenSession reply: a list, not a map"), (b"\xc1", "bad OpenSession")],
)
def test_a_reply_that_is_not_a_map_is_a_request_error(reply: bytes, problem: str) -> None:
    async def main() -> None:
        server, addr = await _serve(reply)
        try:
            with pytest.raises(RequestError, match=problem):
                async with Client(addr, "key", multiplex=False, connect_timeout_s=2.0):
                    raise AssertionError("connected on a reply that is not a map")
        finally:
            await server.stop(None)

    asyncio.run(main())

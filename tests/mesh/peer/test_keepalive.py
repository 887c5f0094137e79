"""Keepalive settings that both ends accept: a stream that carries nothing for many of the
client's ping intervals stays open. With gRPC's default server settings the client's pings
were answered with GOAWAY `too_many_pings` and every idle stream (a peer link without
reports, a coordinator watch between changes) ended after its third ping. Real gRPC over
loopback, with the pings made frequent so that the test takes seconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from mesh.peer._wire import KEEPALIVE_MS, channel_options, server_options

PING_MS = 1000  # the client pings an idle connection this often here (KEEPALIVE_MS in use)
IDLE_S = 8.0  # eight pings: the default server sent GOAWAY at the third


async def _echo(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
    async for message in requests:
        yield message


async def _idle_stream_survives(server_opts: list[tuple[str, object]]) -> bool:
    server = aio.server(options=server_opts)
    handler = grpc.method_handlers_generic_handler(
        "t.Echo", {"Echo": grpc.stream_stream_rpc_method_handler(_echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        options = channel_options(1 << 20, keepalive_ms=PING_MS)
        async with aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            call = channel.stream_stream("/t.Echo/Echo")()
            await call.write(b"first")
            assert await call.read() == b"first"
            await asyncio.sleep(IDLE_S)
            try:
                await call.write(b"after the idle time")
                return bool(await asyncio.wait_for(call.read(), 5) == b"after the idle time")
            except (aio.AioRpcError, asyncio.InvalidStateError):
                return False
            finally:
                call.cancel()
    finally:
        await server.stop(0)


def test_an_idle_stream_outlives_many_pings_with_our_server_options() -> None:
    assert asyncio.run(_idle_stream_survives(server_options(1 << 20, keepalive_ms=PING_MS)))


def test_the_same_pings_end_the_stream_on_a_server_with_grpc_defaults() -> None:
    """What the options fix (so the test above is not passing by accident)."""
    assert not asyncio.run(_idle_stream_survives([]))


def test_the_server_accepts_pings_twice_as_often_as_clients_send_them() -> None:
    opts = dict(server_options(1 << 20))
    assert opts["grpc.http2.min_ping_interval_without_data_ms"] * 2 <= KEEPALIVE_MS
    assert dict(channel_options(1 << 20))["grpc.keepalive_time_ms"] == KEEPALIVE_MS

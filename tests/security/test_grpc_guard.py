"""The call guard's bounds on a real grpc aio server and real sockets: a caller past its
share is refused RESOURCE_EXHAUSTED while another caller is still served; a unary call whose
request does not come is ended after `first_message_s`; every slot comes back when calls end
(however they end); a refused call was never given to the handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
from grpc import aio

from ratemesh import callguard
from ratemesh.callguard import Caller, CallGuard, GuardLimits, Refused

SERVICE = "ratemesh.test.v1.Echo"


class Echo:
    """Unary and streaming echo handlers that record what reached them."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.release = asyncio.Event()

    async def unary(self, request: bytes, context: Any) -> bytes:
        self.seen.append(callguard.caller())
        await self.release.wait()
        return request

    async def stream(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        self.seen.append(callguard.caller())
        async for r in requests:
            yield r


def identify(method: str, md: callguard.Metadata, context: Any) -> Caller:
    who = md.get("who")
    if not isinstance(who, str) or not who:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "who: required", "unauthenticated")
    return Caller(who, who)


async def settled(guard: CallGuard) -> None:
    """Until every slot is back (a client may see its status before the server's handler
    has finished unwinding; they share this loop)."""
    for _ in range(1000):
        if guard.running == 0:
            return
        await asyncio.sleep(0.01)


@asynccontextmanager
async def serving(limits: GuardLimits) -> AsyncIterator[tuple[str, CallGuard, Echo]]:
    echo = Echo()
    guard = CallGuard(identify, limits)
    server = aio.server(options=callguard.server_options(), interceptors=(guard,))
    rpcs = {
        "Unary": grpc.unary_unary_rpc_method_handler(echo.unary),
        "Stream": grpc.stream_stream_rpc_method_handler(echo.stream),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, rpcs),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", guard, echo
    finally:
        await server.stop(0)


def test_a_caller_past_its_share_is_refused_and_another_is_served() -> None:
    async def main() -> None:
        limits = GuardLimits(calls_max=8, caller_calls_max=3, first_message_s=30)
        async with serving(limits) as (addr, guard, echo), aio.insecure_channel(addr) as ch:
            unary = ch.unary_unary(f"/{SERVICE}/Unary")
            held = [
                asyncio.ensure_future(unary(b"x", metadata=(("who", "m"),), timeout=30))
                for _ in range(3)
            ]
            for _ in range(500):
                if guard.running == 3:
                    break
                await asyncio.sleep(0.01)
            assert guard.by_caller() == {"m": 3}
            try:
                await unary(b"x", metadata=(("who", "m"),), timeout=30)
                raise AssertionError("a fourth call of m was served")
            except aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                assert "caller_calls_max 3" in (exc.details() or "")
            try:
                await unary(b"x", timeout=30)  # no credential: refused, never reaches echo
                raise AssertionError("a call without `who` was served")
            except aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
            echo.release.set()
            assert await unary(b"y", metadata=(("who", "n"),), timeout=30) == b"y"
            assert [await h for h in held] == [b"x"] * 3
            assert guard.refused_by == {"call_limit": 1, "unauthenticated": 1}
            assert echo.seen == ["m", "m", "m", "n"]
            await settled(guard)
            assert guard.running == 0 and guard.by_caller() == {}

    asyncio.run(main())


def test_a_request_that_does_not_come_ends_the_call_and_frees_its_slot() -> None:
    async def main() -> None:
        limits = GuardLimits(calls_max=4, caller_calls_max=4, first_message_s=0.5)
        async with serving(limits) as (addr, guard, echo), aio.insecure_channel(addr) as ch:
            # a unary method called as a stream that never writes: headers only
            silent = [
                ch.stream_stream(f"/{SERVICE}/Unary")(metadata=(("who", "m"),)) for _ in range(4)
            ]
            codes = await asyncio.wait_for(asyncio.gather(*(c.code() for c in silent)), 30)
            assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
            assert guard.refused_by == {"slow_request": 4}
            await settled(guard)
            assert guard.running == 0 and echo.seen == []
            # a stream's messages pass through; its slot returns when it ends
            call = ch.stream_stream(f"/{SERVICE}/Stream")(metadata=(("who", "m"),))
            await call.write(b"a")
            assert await call.read() == b"a"
            assert guard.running == 1
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
            await settled(guard)
            assert guard.running == 0 and guard.by_caller() == {}

    asyncio.run(main())

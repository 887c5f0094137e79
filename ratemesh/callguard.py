"""One guard for every gRPC listener (the peer service, the sidecar's Admission API,
governord): a call is admitted from its metadata before it is given anything.

Why: grpc aio reads a unary call's request before it runs the handler, and counts the call
against `maximum_concurrent_rpcs` from the moment its headers arrive, so a caller that sent
headers and never the request held a slot (and about 18 KB) without showing a credential;
enough of them and an honest member's stream was refused RESOURCE_EXHAUSTED, uncounted.

The guard is a server interceptor. It hands grpc every method as a request-streaming one
(whose handler grpc starts without reading anything), and there, before anything else:

1. the listener's `identify` names the caller from the call's metadata and connection (a
   proof, a token, a certificate) or raises `Refused`: the call ends at once, counted, with
   nothing kept;
2. the call is admitted under `GuardLimits.calls_max` calls in all and
   `caller_calls_max` per identified caller, or refused RESOURCE_EXHAUSTED (`call_limit`);
3. a call with one request message gets `first_message_s` to send it, or ends
   DEADLINE_EXCEEDED (`slow_request`);
4. the method's own handler runs; the slot is released when the call ends, however it ends.

The guard's work is once per call: a stream's messages go straight to its handler (one whose
handler writes through its context pays nothing per message; a generator's replies pass
through one `yield`). What `identify` returns is the call's `caller()` in its handler.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import grpc
from grpc import aio

__all__ = [
    "CALLS_MAX",
    "CALLER_CALLS_MAX",
    "CONNECTION_STREAMS_MAX",
    "FIRST_MESSAGE_S",
    "GUARD_REASONS",
    "CallGuard",
    "Caller",
    "GuardLimits",
    "Refused",
    "caller",
    "server_options",
]

# Defaults; each listener names its own where they differ (docs/security.md).
CALLS_MAX = 1024  # calls running at once on one server, all callers
CALLER_CALLS_MAX = 256  # of them, one identified caller's
FIRST_MESSAGE_S = 10.0  # a unary call's request must arrive within this of its headers
# HTTP/2 streams one connection may hold open (grpc's GRPC_ARG_MAX_CONCURRENT_STREAMS): a
# client past it waits for one to end; a connection cannot pile up calls without bound.
CONNECTION_STREAMS_MAX = 256
# Why the guard itself refused a call (listeners add their own reasons for `identify`).
GUARD_REASONS = ("call_limit", "slow_request")

Metadata = Mapping[str, str | bytes]
Context: TypeAlias = "aio.ServicerContext[Any, Any]"


class Caller(NamedTuple):
    """Who a call is from: `key` is what the per-caller bound counts (an authenticated
    identity), `value` what the handler reads back through `caller()`."""

    key: str
    value: Any = None


class Refused(Exception):
    """`identify`'s refusal: the call ends with `code` and `details` (and `trailing`
    metadata) at once; `reason`, if given, is counted."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        reason: str | None = None,
        trailing: tuple[tuple[str, str | bytes], ...] = (),
    ) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.reason = reason
        self.trailing = trailing


@dataclass(frozen=True, slots=True)
class GuardLimits:
    calls_max: int = CALLS_MAX
    caller_calls_max: int = CALLER_CALLS_MAX
    first_message_s: float = FIRST_MESSAGE_S

    def __post_init__(self) -> None:
        if self.calls_max < 1 or self.caller_calls_max < 1 or self.first_message_s <= 0:
            raise ValueError(f"guard limits must be positive: {self!r}")


Identify = Callable[[str, Metadata, Context], Caller]
OnRefused = Callable[["Refused", Context], None]  # told of each counted refusal

_CALLER: ContextVar[Any] = ContextVar("ratemesh_caller")


def caller() -> Any:
    """In a guarded handler: the `Caller.value` its call was admitted with."""
    return _CALLER.get()


def server_options() -> list[tuple[str, Any]]:
    """Server options every guarded listener sets (the per-connection stream bound)."""
    return [("grpc.max_concurrent_streams", CONNECTION_STREAMS_MAX)]


class CallGuard(aio.ServerInterceptor):  # type: ignore[misc]
    """The interceptor (module docstring); `refused_by` counts refusals by reason."""

    def __init__(
        self,
        identify: Identify,
        limits: GuardLimits = GuardLimits(),
        *,
        on_refused: OnRefused | None = None,
    ) -> None:
        self.identify = identify
        self.limits = limits
        self.on_refused = on_refused
        self.running = 0
        self._by_caller: dict[str, int] = {}  # callers with a call running: <= calls_max
        self.refused_by: dict[str, int] = {}

    def by_caller(self) -> dict[str, int]:
        return dict(self._by_caller)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        return self._guarded(handler, details.method)

    # -- admission --------------------------------------------------------------------------

    async def _admit(self, method: str, context: Context) -> Caller:
        """Identify and count the call, or end it (abort raises)."""
        md: dict[str, str | bytes] = {k: v for k, v in (context.invocation_metadata() or ())}
        try:
            who = self.identify(method, md, context)
            if self.running >= self.limits.calls_max:
                raise Refused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self.running} calls are running on this server "
                    f"(calls_max {self.limits.calls_max})",
                    "call_limit",
                )
            held = self._by_caller.get(who.key, 0)
            if held >= self.limits.caller_calls_max:
                raise Refused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"this caller has {held} calls running on this server "
                    f"(caller_calls_max {self.limits.caller_calls_max})",
                    "call_limit",
                )
        except Refused as exc:
            self._refuse(exc, context)
            await context.abort(exc.code, exc.details, exc.trailing)
            raise AssertionError("unreachable: abort raises") from None
        self.running += 1
        self._by_caller[who.key] = held + 1
        _CALLER.set(who.value)
        return who

    def _release(self, who: Caller) -> None:
        self.running -= 1
        left = self._by_caller[who.key] - 1
        if left:
            self._by_caller[who.key] = left
        else:
            del self._by_caller[who.key]

    def _refuse(self, exc: Refused, context: Context) -> None:
        if exc.reason is None:
            return
        self.refused_by[exc.reason] = self.refused_by.get(exc.reason, 0) + 1
        if self.on_refused is not None:
            self.on_refused(exc, context)

    async def _first(self, requests: AsyncIterator[Any], context: Context) -> Any:
        """A unary call's request, within `first_message_s`, or end the call."""
        try:
            async with asyncio.timeout(self.limits.first_message_s):
                return await anext(requests)
        except TimeoutError:
            exc = Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no request within {self.limits.first_message_s:g} s of the call's headers",
                "slow_request",
            )
        except StopAsyncIteration:
            exc = Refused(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request")
        self._refuse(exc, context)
        await context.abort(exc.code, exc.details)
        raise AssertionError("unreachable: abort raises")

    # -- handlers ---------------------------------------------------------------------------

    def _guarded(self, h: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """`h` as a request-streaming handler that admits first (module docstring)."""
        inner: Callable[..., Any]
        unary_in = not h.request_streaming
        if h.request_streaming:
            inner = h.stream_stream if h.response_streaming else h.stream_unary
        else:
            inner = h.unary_stream if h.response_streaming else h.unary_unary

        async def one(requests: AsyncIterator[Any], context: Context) -> Any:
            who = await self._admit(method, context)
            try:
                arg = await self._first(requests, context) if unary_in else requests
                out = inner(arg, context)
                return await out if inspect.isawaitable(out) else out
            finally:
                self._release(who)

        async def many(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
            who = await self._admit(method, context)
            try:
                arg = await self._first(requests, context) if unary_in else requests
                async for reply in inner(arg, context):
                    yield reply
            finally:
                self._release(who)

        des, ser = h.request_deserializer, h.response_serializer
        if not h.response_streaming:
            return grpc.stream_unary_rpc_method_handler(one, des, ser)
        if inspect.isasyncgenfunction(inner):
            return grpc.stream_stream_rpc_method_handler(many, des, ser)
        return grpc.stream_stream_rpc_method_handler(one, des, ser)  # writes via its context

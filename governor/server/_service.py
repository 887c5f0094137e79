"""The governord gRPC service: decode and check, authenticate, one engine step, await the
commit, reply. Nothing replies before the record holds everything its answer depends on.

It composes its parts: ``Steps`` (an engine step and the wait for its commit), ``Auth`` (who a
call is from) and the groups of calls (``SessionCalls``, ``NodeCalls``, ``CreditCalls``), whose
tables together name every unary method of ``wire.METHODS``.

Engine steps run on the event loop thread under the Authority's lock (a few microseconds);
the wait for the commit is an awaited future resolved by the log's writer thread, so no thread
is parked per call. A retry of a request id that is still running awaits the first attempt and
gets the same answer (in-flight idempotency; the engine's durable memory covers later retries).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from governor import wire
from governor.authority import Authority
from governor.config import GovernordConfig
from governor.engine import GovernorError

from ._auth import KEY_SESSION_TTL_MS, Auth
from ._calls import Impl, Principal, Steps
from ._commit import CommitWaits
from ._creditcalls import CreditCalls
from ._logs import FIELDS
from ._metrics import Metrics
from ._multiplex import Metadata, MuxStream
from ._nodecalls import NodeCalls
from ._sessioncalls import SessionCalls
from ._status import Fail, error_fail

__all__ = ["GovernorService", "KEY_SESSION_TTL_MS"]

INFLIGHT_MAX = 65_536

log = logging.getLogger("governord.call")
# A call is logged at DEBUG (one line per call is too many for a busy governord) unless its
# code says the store or governord itself is in trouble.
_LOG_LEVELS = {
    grpc.StatusCode.INTERNAL: logging.ERROR,
    grpc.StatusCode.DATA_LOSS: logging.ERROR,
    grpc.StatusCode.UNAVAILABLE: logging.WARNING,
}


def _call_fields(
    method: wire.Method,
    body: dict[str, Any],
    who: Principal | None,
    code: grpc.StatusCode,
    reason: str | None,
    t0: float,
) -> dict[str, Any]:
    """A call's log fields: what an operator greps for (the request id first)."""
    fields: dict[str, Any] = {"method": method.name, "code": code.name}
    rid = body.get("request_id")
    if rid is not None:
        fields["request_id"] = rid
    if reason is not None:
        fields["reason"] = reason
    if who is not None:
        fields["session_id"] = who.session_id
        if who.tenant:
            fields["tenant"] = who.tenant
    fields["took_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    return fields


class GovernorService:
    """The calls, and Multiplex carrying the short ones. ``handler()`` is the generic
    gRPC handler to add to a server."""

    def __init__(
        self,
        authority: Authority,
        config: GovernordConfig,
        tenants: dict[str, tuple[str, int]],  # key sha256 -> (tenant name, scope node id)
        metrics: Metrics,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.authority = authority
        self.config = config
        self.tenants = tenants
        self.metrics = metrics
        self.commits = CommitWaits(authority, loop)
        self._loop = loop
        steps = Steps(authority, self.commits, loop)
        self.auth = Auth(authority, steps, tenants)
        self._nodes = NodeCalls(steps)
        self._inflight: dict[tuple[Any, ...], list[Any]] = {}  # key -> [raw, future | None]
        self._drain = asyncio.Event()
        self._impls: dict[str, Impl] = {
            **SessionCalls(steps, config).calls(),
            **self._nodes.calls(),
            **CreditCalls(steps).calls(),
        }
        unary = {name for name, m in wire.METHODS.items() if not m.stream}
        assert set(self._impls) == unary, sorted(set(self._impls) ^ unary)
        self._counters: dict[tuple[str, grpc.StatusCode], Any] = {}
        self._latency: dict[str, Any] = {}

    def handler(self) -> grpc.GenericRpcHandler:
        rpcs: dict[str, grpc.RpcMethodHandler] = {}
        for name, method in wire.METHODS.items():
            if method.stream:
                rpcs[name] = grpc.unary_stream_rpc_method_handler(self._streamer(method))
            else:
                rpcs[name] = grpc.unary_unary_rpc_method_handler(self._unary(method))
        rpcs[wire.MULTIPLEX] = grpc.stream_stream_rpc_method_handler(self._multiplex)
        return grpc.method_handlers_generic_handler(wire.SERVICE, rpcs)

    @property
    def draining(self) -> bool:
        return self._drain.is_set()

    @draining.setter
    def draining(self, value: bool) -> None:
        """Stop taking calls; open Multiplex streams finish what runs, then end UNAVAILABLE."""
        if value:
            self._drain.set()
        else:
            self._drain.clear()

    async def run(self, method: wire.Method, raw: bytes, md: Metadata) -> dict[str, Any]:
        """One call, unary or streamed alike: check, authenticate, run once, count.

        ``md`` is the call's metadata (a Multiplex call uses its stream's), so auth and scope
        are the same code whichever way the call travels. Raises Fail for an error reply.
        """
        t0 = time.perf_counter()
        code = grpc.StatusCode.OK
        reason: str | None = None
        body: dict[str, Any] = {}
        who: Principal | None = None
        try:
            if self._drain.is_set():
                raise Fail(grpc.StatusCode.UNAVAILABLE, "draining", "governord is stopping")
            body = _decode(method, raw)
            who = await self.auth.authenticate(method, md)
            return await self._once(method, who, body, raw, self._impls[method.name])
        except Fail as f:
            code, reason = f.code, f.detail["reason"]
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception:
            code = grpc.StatusCode.UNKNOWN  # a bug: gRPC reports it as UNKNOWN
            log.exception(
                "call failed: a bug",
                extra={FIELDS: _call_fields(method, body, who, code, None, t0)},
            )
            raise
        finally:
            self._count(method.name, code, time.perf_counter() - t0)
            level = _LOG_LEVELS.get(code, logging.DEBUG)
            if code is not grpc.StatusCode.UNKNOWN and log.isEnabledFor(level):
                log.log(
                    level, "call", extra={FIELDS: _call_fields(method, body, who, code, reason, t0)}
                )

    def _count(self, method: str, code: grpc.StatusCode, took: float) -> None:
        key = (method, code)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self.metrics.calls.labels(method, code.name)
        counter.inc()
        latency = self._latency.get(method)
        if latency is None:
            latency = self._latency[method] = self.metrics.latency.labels(method)
        latency.observe(took)

    def _unary(
        self, method: wire.Method
    ) -> Callable[[bytes, aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]:
        async def call(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
            try:
                reply = await self.run(method, request, dict(context.invocation_metadata() or ()))
            except Fail as f:
                await context.abort(
                    f.code, f.detail["message"], ((wire.ERROR_MD, wire.pack(f.detail)),)
                )
                raise  # unreachable: abort raises
            return wire.pack(reply)

        return call

    async def _multiplex(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext[bytes, bytes]
    ) -> None:
        stream = MuxStream(self, context)
        try:
            await stream.serve(requests, self._drain)
        finally:
            self.metrics.calls.labels(wire.MULTIPLEX, stream.code.name).inc()

    async def _once(
        self,
        method: wire.Method,
        who: Principal | None,
        body: dict[str, Any],
        raw: bytes,
        impl: Impl,
    ) -> dict[str, Any]:
        """Run ``impl``; a retry of a request id still in flight waits for the same answer."""
        rid = body.get("request_id")
        if rid is None or who is None:
            return await self._guard(impl(who, body))
        key = (who.session_id, method.name, rid)
        known = self._inflight.get(key)
        if known is not None:
            if known[0] != raw:
                raise Fail(
                    grpc.StatusCode.ALREADY_EXISTS,
                    "request_id_reused",
                    f"request_id {rid!r} is in flight with other arguments",
                    field="request_id",
                )
            if known[1] is None:
                known[1] = self._loop.create_future()
            result = await asyncio.shield(known[1])
            assert isinstance(result, dict)
            return result
        if len(self._inflight) >= INFLIGHT_MAX:
            raise Fail(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", "too many calls in flight")
        entry: list[Any] = [raw, None]  # the future is made only if a retry comes to wait
        self._inflight[key] = entry
        try:
            result = await self._guard(impl(who, body))
        except BaseException as exc:
            fut = entry[1]
            if fut is not None:
                cancelled = Fail(
                    grpc.StatusCode.UNAVAILABLE, "retry", "the first attempt was cancelled"
                )
                fut.set_exception(exc if isinstance(exc, Fail) else cancelled)
                fut.exception()  # mark retrieved
            raise
        else:
            if entry[1] is not None:
                entry[1].set_result(result)
            return result
        finally:
            del self._inflight[key]

    @staticmethod
    async def _guard(coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        try:
            return await coro
        except GovernorError as exc:
            raise error_fail(exc) from exc

    def _streamer(
        self, method: wire.Method
    ) -> Callable[[bytes, aio.ServicerContext[bytes, bytes]], AsyncIterator[bytes]]:
        async def stream(
            request: bytes, context: aio.ServicerContext[bytes, bytes]
        ) -> AsyncIterator[bytes]:
            code = grpc.StatusCode.OK
            try:
                body = _decode(method, request)
                who = await self.auth.authenticate(
                    method, dict(context.invocation_metadata() or ())
                )
                assert who is not None
                async for item in self._nodes.watch(who, body):
                    yield wire.pack(item)
            except Fail as f:
                code = f.code
                await context.abort(
                    f.code, f.detail["message"], ((wire.ERROR_MD, wire.pack(f.detail)),)
                )
            finally:
                self.metrics.calls.labels(method.name, code.name).inc()

        return stream


def _decode(method: wire.Method, raw: bytes) -> dict[str, Any]:
    """A request body checked against its method's schema, or INVALID_ARGUMENT naming it."""
    try:
        return wire.check_request(method, wire.unpack(raw))
    except wire.WireError as exc:
        raise Fail(
            grpc.StatusCode.INVALID_ARGUMENT, "malformed", str(exc), field=exc.field
        ) from exc

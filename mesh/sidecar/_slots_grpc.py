"""The Concurrency gRPC service (mesh/sidecar/concurrency.proto): Acquire and Release over
a `SlotTokens` table, the caller named by its bearer credential or its host."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc import aio

from mesh.errors import ConfigError
from mesh.sidecar import concurrency_pb2 as pb
from mesh.sidecar._slots import SLOT_TTL_MS_DEFAULT, SlotTokens, client_of

__all__ = ["CONCURRENCY_SERVICE", "slot_handlers"]

CONCURRENCY_SERVICE = "ratemesh.sidecar.v1.Concurrency"
M = TypeVar("M", bound=Message)


def _client(context: aio.ServicerContext[bytes, bytes], auth_header: str) -> str:
    md = dict(context.invocation_metadata() or ())
    token = md.get(auth_header)
    peer = context.peer() or ""
    host = peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer  # ipv4:h:port -> ipv4:h
    return client_of(token.encode() if isinstance(token, str) else token, host)


async def _parse(cls: type[M], data: bytes, context: aio.ServicerContext[bytes, bytes]) -> M:
    """The request message, or abort INVALID_ARGUMENT saying why."""
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: {exc}")
        raise AssertionError("unreachable: abort raises") from exc


def slot_handlers(tokens: Callable[[], SlotTokens], auth_header: str) -> grpc.GenericRpcHandler:
    async def acquire(data: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        req = await _parse(pb.AcquireRequest, data, context)
        ttl_ms = req.ttl_ms if req.HasField("ttl_ms") else SLOT_TTL_MS_DEFAULT
        doc = {"tenant": req.tenant, "metric": req.metric, "ttl_ms": ttl_ms}
        try:
            out = tokens().acquire(_client(context, auth_header), doc)
        except ConfigError as exc:
            code = grpc.StatusCode.INVALID_ARGUMENT
            if "slot tokens" in str(exc):
                code = grpc.StatusCode.RESOURCE_EXHAUSTED
            await context.abort(code, str(exc))
            raise AssertionError("unreachable: abort raises") from exc
        return pb.AcquireResponse(**out).SerializeToString()

    async def release(data: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        req = await _parse(pb.ReleaseRequest, data, context)
        ok = tokens().release(_client(context, auth_header), {"token": req.token})
        return pb.ReleaseResponse(ok=ok).SerializeToString()

    rpc = {
        "Acquire": grpc.unary_unary_rpc_method_handler(acquire),
        "Release": grpc.unary_unary_rpc_method_handler(release),
    }
    return grpc.method_handlers_generic_handler(CONCURRENCY_SERVICE, rpc)

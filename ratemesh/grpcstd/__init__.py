"""The standard gRPC services every ratemesh gRPC port serves beside its own (the node's peer
port, the sidecar's, governord's): `grpc.health.v1.Health` (Check and Watch) and server
reflection (`grpc.reflection.v1alpha` and `v1`), each from the official .proto compiled
beside this module (health.proto, reflection_*.proto; the PyPI packages that usually carry
them are not a dependency).

Why here: both planes register them, and `ratemesh` is the one package both may import; like
`ratemesh.callguard` it is an exception to ratemesh's "no grpc" contract (pyproject.toml),
kept to these modules. Nothing in `mesh.core` or `governor.engine` imports it.

Who may call: `Health/Check` answers without a credential (Kubernetes' grpc probes and load
balancers call it with none; it says SERVING or NOT_SERVING and nothing else), through
`open_health`, which each listener wraps around its own caller check. `Health/Watch` (a
stream that holds a call slot) and reflection (the schema of every service on the port) go
through the listener's check like any other call (docs/security.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc import aio

from ratemesh.callguard import Caller, Identify, Metadata
from ratemesh.grpcstd import health_pb2, reflection_v1_pb2, reflection_v1alpha_pb2

__all__ = [
    "HEALTH_CHECK",
    "HEALTH_SERVICE",
    "REFLECTION_SERVICES",
    "WATCH_POLL_S",
    "Ready",
    "add_standard_services",
    "is_standard",
    "open_health",
]

HEALTH_SERVICE = "grpc.health.v1.Health"
HEALTH_CHECK = f"/{HEALTH_SERVICE}/Check"
REFLECTION_SERVICES = (
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)
# How often a Watch stream looks at its status: readiness changes at policy loads and
# leadership changes, seconds apart; a poll costs one call of a cheap function.
WATCH_POLL_S = 1.0
# Files one reflection answer carries (a file and its imports): the ones served are a few.
_FILES_MAX = 64

_PREFIXES = (f"/{HEALTH_SERVICE}/", *(f"/{s}/" for s in REFLECTION_SERVICES))

Ready = Callable[[], bool]  # whether the port's service can answer its callers now
_Status = health_pb2.HealthCheckResponse


def open_health(identify: Identify) -> Identify:
    """`identify` with `Health/Check` let through without a credential (module docstring);
    every other method, Watch and reflection included, goes to `identify`."""

    def check(method: str, md: Metadata, context: Any) -> Caller:
        if method == HEALTH_CHECK:
            return Caller("health_check")
        return identify(method, md, context)

    return check


def is_standard(method: str) -> bool:
    """Whether `method` (a call's full method name) is one of this module's services."""
    return method.startswith(_PREFIXES)


def add_standard_services(
    server: aio.Server, services: Mapping[str, Ready], *, ready: Ready | None = None
) -> None:
    """Register Health and reflection on `server`, before it starts. `services` maps each
    service the port serves to whether it is ready; the overall status ("") is `ready`,
    else all of them."""
    overall = ready or (lambda: all(r() for r in services.values()))
    health = _Health({"": overall, **services})
    names = sorted({*services, HEALTH_SERVICE, *REFLECTION_SERVICES})
    handlers: list[grpc.GenericRpcHandler] = [
        grpc.method_handlers_generic_handler(
            HEALTH_SERVICE,
            {
                "Check": grpc.unary_unary_rpc_method_handler(
                    health.check,
                    request_deserializer=health_pb2.HealthCheckRequest.FromString,
                    response_serializer=_Status.SerializeToString,
                ),
                "Watch": grpc.unary_stream_rpc_method_handler(
                    health.watch,
                    request_deserializer=health_pb2.HealthCheckRequest.FromString,
                    response_serializer=_Status.SerializeToString,
                ),
            },
        )
    ]
    for service, pb in zip(
        REFLECTION_SERVICES, (reflection_v1alpha_pb2, reflection_v1_pb2), strict=True
    ):
        reflection = _Reflection(pb, names)
        handlers.append(
            grpc.method_handlers_generic_handler(
                service,
                {
                    "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                        reflection.info,
                        request_deserializer=pb.ServerReflectionRequest.FromString,
                        response_serializer=pb.ServerReflectionResponse.SerializeToString,
                    )
                },
            )
        )
    server.add_generic_rpc_handlers(tuple(handlers))


class _Health:
    def __init__(self, statuses: Mapping[str, Ready]) -> None:
        self.statuses = dict(statuses)

    def status(self, service: str) -> Any:
        ready = self.statuses.get(service)
        if ready is None:
            return None
        return _Status.SERVING if ready() else _Status.NOT_SERVING

    async def check(
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return _Status(status=status)

    async def watch(
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """The status now, then each change, until the caller goes away (the standard's
        SERVICE_UNKNOWN for a service this port does not serve)."""
        last: Any = -1
        while True:
            status = self.status(request.service)
            shown = _Status.SERVICE_UNKNOWN if status is None else status
            if shown != last:
                last = shown
                yield _Status(status=shown)
            await asyncio.sleep(WATCH_POLL_S)


class _Reflection:
    """ServerReflectionInfo for one of the two packages (same messages, same answers)."""

    def __init__(self, pb: Any, services: Iterable[str]) -> None:
        self.pb = pb
        self.services = list(services)
        self.pool = descriptor_pool.Default()

    async def info(
        self, requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        async for request in requests:
            yield self.answer(request)

    def answer(self, request: Any) -> Any:
        pb = self.pb
        out = pb.ServerReflectionResponse(valid_host=request.host, original_request=request)
        kind = request.WhichOneof("message_request")
        try:
            if kind == "list_services":
                out.list_services_response.service.extend(
                    pb.ServiceResponse(name=n) for n in self.services
                )
            elif kind == "file_by_filename":
                self._files(out, self.pool.FindFileByName(request.file_by_filename))
            elif kind == "file_containing_symbol":
                symbol = request.file_containing_symbol
                self._files(out, self.pool.FindFileContainingSymbol(symbol))
            else:  # extensions: no service here declares any
                raise KeyError(kind)
        except KeyError:
            out.error_response.error_code = grpc.StatusCode.NOT_FOUND.value[0]
            out.error_response.error_message = f"not found ({kind})"
        return out

    def _files(self, out: Any, first: FileDescriptor) -> None:
        """`first` and every file it imports, once each, the first one first."""
        seen: dict[str, FileDescriptor] = {}
        todo = [first]
        while todo and len(seen) < _FILES_MAX:
            f = todo.pop()
            if f.name in seen:
                continue
            seen[f.name] = f
            todo.extend(f.dependencies)
        out.file_descriptor_response.file_descriptor_proto.extend(
            f.serialized_pb for f in seen.values()
        )

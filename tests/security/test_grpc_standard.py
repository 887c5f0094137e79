"""The ways in that gRPC health, server reflection and Envoy's RateLimitService add
(docs/security.md): Health/Check answers anyone (probes carry no credential) and says only
SERVING or NOT_SERVING; Health/Watch, reflection and ShouldRateLimit need the port's own
credential, checked by the call guard before anything is read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from bench._procs import read_ready, stop
from mesh.sidecar import RLS_SERVICE
from mesh.sidecar.rls import rls_pb2
from ratemesh.grpcstd import health_pb2, reflection_v1_pb2, reflection_v1alpha_pb2
from tests.governor._daemon import KEYS, Daemon
from tests.governor._stores import make_target
from tests.mesh.sidecar._envoy import HERE, request
from tests.mesh.sidecar._node import insecure, node
from tests.security._nodes import node_configs, spawn_node

TOKEN = "sidecar-token-for-the-standard-services-01"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _check(ch: aio.Channel | grpc.Channel) -> Any:
    return ch.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


def _watch(ch: aio.Channel) -> Any:
    return ch.unary_stream(
        "/grpc.health.v1.Health/Watch",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


def _reflect(ch: aio.Channel | grpc.Channel, pb: Any = reflection_v1_pb2) -> Any:
    return ch.stream_stream(
        f"/{pb.DESCRIPTOR.package}.ServerReflection/ServerReflectionInfo",
        request_serializer=pb.ServerReflectionRequest.SerializeToString,
        response_deserializer=pb.ServerReflectionResponse.FromString,
    )


def _rls(ch: aio.Channel) -> Any:
    return ch.unary_unary(
        f"/{RLS_SERVICE}/ShouldRateLimit",
        request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
        response_deserializer=rls_pb2.RateLimitResponse.FromString,
    )


def _sidecar_config(tmp: Path, with_rules: bool = True) -> dict[str, Any]:
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    cfg: dict[str, Any] = {
        "member_id": "a",
        "sidecar": {"grpc_listen": "127.0.0.1:0", "require_auth": True, "token_file": str(token)},
    }
    if with_rules:
        cfg["envoy_rls"] = {"config_files": [str(HERE / "basic.yaml")], "mode": "local"}
    return cfg


async def _code(call: Any) -> grpc.StatusCode:
    try:
        await call
    except aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_sidecar_rls_and_reflection_need_the_token_and_health_check_does_not(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with node(_sidecar_config(tmp_path)) as m:
            async with insecure(m.sidecar_addresses["grpc"]) as ch:
                auth = (("authorization", f"Bearer {TOKEN}"),)
                req = request("basic", [("key1", "x")])
                assert await _code(_rls(ch)(req)) == grpc.StatusCode.UNAUTHENTICATED
                wrong = (("authorization", "Bearer not-the-token-0123456789"),)
                assert await _code(_rls(ch)(req, metadata=wrong)) == grpc.StatusCode.UNAUTHENTICATED
                resp = await _rls(ch)(req, metadata=auth)
                assert resp.overall_code == rls_pb2.RateLimitResponse.OK
                assert resp.statuses[0].limit_remaining == 49

                health = await _check(ch)(health_pb2.HealthCheckRequest())
                assert health.status == SERVING
                named = await _check(ch)(health_pb2.HealthCheckRequest(service=RLS_SERVICE))
                assert named.status == SERVING
                unknown = _check(ch)(health_pb2.HealthCheckRequest(service="nope"))
                assert await _code(unknown) == grpc.StatusCode.NOT_FOUND
                watch = _watch(ch)(health_pb2.HealthCheckRequest())
                with pytest.raises(aio.AioRpcError) as info:
                    await watch.read()
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                watch = _watch(ch)(health_pb2.HealthCheckRequest(), metadata=auth)
                assert (await watch.read()).status == SERVING
                watch.cancel()

                for pb in (reflection_v1_pb2, reflection_v1alpha_pb2):
                    ask = pb.ServerReflectionRequest(list_services="")
                    call = _reflect(ch, pb)(iter([ask]))
                    with pytest.raises(aio.AioRpcError) as info:
                        await call.read()
                    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    symbol = pb.ServerReflectionRequest(file_containing_symbol=RLS_SERVICE)
                    call = _reflect(ch, pb)(iter([ask, symbol]), metadata=auth)
                    listed = await call.read()
                    names = {s.name for s in listed.list_services_response.service}
                    assert {RLS_SERVICE, "ratemesh.sidecar.v1.Admission"} <= names
                    assert "grpc.health.v1.Health" in names
                    files = (await call.read()).file_descriptor_response.file_descriptor_proto
                    assert len(files) >= 3  # rls.proto and what it imports
                    call.cancel()

    asyncio.run(main())


def test_sidecar_health_is_not_serving_until_the_node_has_policies(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(_sidecar_config(tmp_path, with_rules=False)) as m:
            async with insecure(m.sidecar_addresses["grpc"]) as ch:
                health = await _check(ch)(health_pb2.HealthCheckRequest())
                assert health.status == NOT_SERVING

    asyncio.run(main())


@pytest.mark.slow
def test_peer_port_health_answers_and_reflection_needs_a_member_proof(tmp_path: Path) -> None:
    proc = spawn_node(tmp_path, node_configs(tmp_path, ("a",))["a"])
    try:
        addr = read_ready(proc)["address"]
        with grpc.insecure_channel(addr) as ch:
            assert _check(ch)(health_pb2.HealthCheckRequest(), timeout=10).status == SERVING
            ask = reflection_v1_pb2.ServerReflectionRequest(list_services="")
            with pytest.raises(grpc.RpcError) as info:
                next(iter(_reflect(ch)(iter([ask]), timeout=10)))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        stop(proc)


@pytest.mark.slow
def test_governord_health_answers_and_reflection_needs_a_key(tmp_path: Path) -> None:
    for store in make_target("sqlite", tmp_path):
        daemon = Daemon(tmp_path, store, tenants={"a": {"api_key_env": "KEY_A"}})
        daemon.start()
        try:
            with grpc.insecure_channel(daemon.addr) as ch:
                health = _check(ch)(health_pb2.HealthCheckRequest(), timeout=10)
                assert health.status == SERVING
                ask = reflection_v1_pb2.ServerReflectionRequest(list_services="")
                with pytest.raises(grpc.RpcError) as info:
                    next(iter(_reflect(ch)(iter([ask]), timeout=10)))
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                md = (("x-governor-key", KEYS["KEY_A"]),)
                listed = next(iter(_reflect(ch)(iter([ask]), metadata=md, timeout=10)))
                names = {s.name for s in listed.list_services_response.service}
                assert "grpc.health.v1.Health" in names
        finally:
            daemon.close()

"""Envoy rate limit requests for the sidecar tests: envoyproxy/ratelimit's vendored rule
files (envoy/, README there), a node config serving them, and the call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpc import aio

from mesh.sidecar.rls import rls_pb2 as pb

__all__ = ["HERE", "envoy_config", "request", "rls_call"]

HERE = Path(__file__).parent / "envoy"


def envoy_config(*files: str, **sidecar: Any) -> dict[str, Any]:
    return {
        "member_id": "a",
        "sidecar": {"grpc_listen": "127.0.0.1:0", **sidecar},
        # local: one node's answers are exact, as one ratelimit with its own redis is
        "envoy_rls": {"config_files": [str(HERE / f) for f in files], "mode": "local"},
    }


def request(domain: str, *descriptors: list[tuple[str, str]], hits: int = 0) -> pb.RateLimitRequest:
    req = pb.RateLimitRequest(domain=domain, hits_addend=hits)
    for entries in descriptors:
        d = req.descriptors.add()
        for k, v in entries:
            d.entries.add(key=k, value=v)
    return req


def rls_call(channel: aio.Channel) -> Any:
    return channel.unary_unary(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        request_serializer=pb.RateLimitRequest.SerializeToString,
        response_deserializer=pb.RateLimitResponse.FromString,
    )

"""A real Mesh with its sidecar on loopback (ports bound to 0, read back), and clients."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from grpc import aio

from mesh.node import Mesh
from mesh.peer import MemoryNetwork, MemoryTransport
from mesh.sidecar import admission_pb2 as pb

__all__ = [
    "BYTES",
    "LIMIT",
    "SECRET",
    "admit_call",
    "insecure",
    "item",
    "node",
    "node_config",
    "pairs",
    "wire_fields",
]

# local mode: a verdict depends on this node alone, so two nodes given the same sequence
# answer alike (a slow refill: the sequence runs well inside one unit's time)
LIMIT: dict[str, Any] = {
    "tenant_id": "acme",
    "metric": "read_iops",
    "generation": 1,
    "mode": "local",
    "target_rate": 1,
    "global_burst": 5,
    "local_burst_cap": 5,
}
BYTES: dict[str, Any] = dict(LIMIT, metric="client_egress_bytes", global_burst=1000)
SECRET = "s3cret-s3cret-s3cret-0123456789"


def node_config(sidecar: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "member_id": "a",
        "policies": {"inline": [LIMIT, dict(BYTES, local_burst_cap=1000)]},
        "sidecar": sidecar
        if sidecar is not None
        else {"grpc_listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0"},
        **extra,
    }


@contextlib.asynccontextmanager
async def node(cfg: dict[str, Any]) -> AsyncIterator[Mesh]:
    net = MemoryNetwork()
    async with Mesh(cfg, transport=lambda mid, e, h: MemoryTransport(net, mid, h.deliver)) as m:
        yield m


def item(tenant: str = "acme", metric: str = "read_iops", amount: int | None = None,
         descriptors: Sequence[tuple[str, str]] = ()) -> pb.AdmitItem:  # fmt: skip
    it = pb.AdmitItem(tenant=tenant, metric=metric)
    if amount is not None:
        it.amount = amount
    for k, v in descriptors:
        it.descriptors.add(key=k, value=v)
    return it


def admit_call(channel: aio.Channel, name: str = "Admit") -> Any:
    deserialize = pb.RefundResponse.FromString if name == "Refund" else pb.AdmitResponse.FromString
    return channel.unary_unary(
        f"/ratemesh.sidecar.v1.Admission/{name}",
        request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
        response_deserializer=deserialize,
    )


def pairs(resp: pb.AdmitResponse) -> list[tuple[bool, str]]:
    return [(v.allowed, v.reason) for v in resp.verdicts]


def insecure(addr: str) -> aio.Channel:
    return grpc.aio.insecure_channel(addr)


def wire_fields(v: pb.Verdict) -> dict[str, Any]:
    """A Verdict message as verdict_fields' dict: the plain fields, and the optional ones
    that are set."""
    out: dict[str, Any] = {}
    for f in pb.Verdict.DESCRIPTOR.fields:
        if not f.has_presence or v.HasField(f.name):
            out[f.name] = getattr(v, f.name)
    return out

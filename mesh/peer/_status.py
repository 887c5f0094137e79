"""`mesh status`: ask a member for its view over the peer service's Status call."""

from __future__ import annotations

import time
from typing import Any

import grpc

from mesh.config import TlsConfig
from mesh.core.messages import MAX_MESSAGE_BYTES
from mesh.peer._identity import AUTH_MD, STATUS_ANY_TARGET, STATUS_EPOCH, sign
from mesh.peer._link import open_channel
from mesh.peer._wire import MEMBER_MD, SCHEMA, STATUS, pack, translate, unpack

__all__ = ["fetch_status", "STATUS_CALLER"]

STATUS_CALLER = "mesh-status"  # the id a Status caller claims (it proves the secret, no more)


def status_proof(fleet_secret: bytes, target: str = STATUS_ANY_TARGET) -> str:
    """A Status caller's fleet-secret proof, made now, for `target` (a member's id, or
    STATUS_ANY_TARGET): over the word `status` in the worker_epoch's place, so that it
    cannot open a stream nor a stream's proof a Status call."""
    return sign(
        fleet_secret,
        member=STATUS_CALLER,
        epoch=STATUS_EPOCH,
        schema=SCHEMA,
        target=target,
        now_s=int(time.time()),
    )


async def fetch_status(
    addr: str,
    *,
    tls: TlsConfig | None = None,
    timeout_s: float = 5.0,
    fleet_secret: bytes | None = None,
    target: str = STATUS_ANY_TARGET,
) -> dict[str, Any]:
    """The member's view. A mesh with mTLS needs `tls` (a certificate of the fleet's CA);
    one with a fleet secret needs `fleet_secret`, proved for `target`, the member's id if
    known (a proof for STATUS_ANY_TARGET is good at any member of the fleet)."""
    md: tuple[tuple[str, str], ...] = ((MEMBER_MD, STATUS_CALLER),)
    if fleet_secret is not None:
        md = (*md, (AUTH_MD, status_proof(fleet_secret, target)))
    async with open_channel(addr, tls, MAX_MESSAGE_BYTES) as channel:
        try:
            call = channel.unary_unary(STATUS)
            data = await call(pack({}), timeout=timeout_s, metadata=md)
        except grpc.RpcError as exc:
            raise translate(exc, f"status {addr}") from exc
    out = unpack(data, "status")
    assert isinstance(out, dict)
    return out

"""`mesh status`: ask a member for its view over the peer service's Status call.

A fleet-secret proof names the member it is for, so that one captured at a member cannot be
replayed at another. A caller that knows only an address first asks without a proof: a
member with a secret refuses, naming itself in the refusal's trailing metadata, and the
second call is signed for that id (a member without one simply answers).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from mesh.config import TlsConfig
from mesh.core.messages import MAX_MESSAGE_BYTES
from mesh.errors import MessageError
from mesh.peer._identity import AUTH_MD, STATUS_EPOCH, sign
from mesh.peer._link import open_channel
from mesh.peer._wire import MEMBER_MD, SCHEMA, STATUS, pack, translate, unpack

__all__ = ["fetch_status", "STATUS_CALLER"]

STATUS_CALLER = "mesh-status"  # the id a Status caller claims (it proves the secret, no more)


def status_proof(fleet_secret: bytes, target: str, epoch: str = STATUS_EPOCH) -> str:
    """A Status caller's fleet-secret proof, made now, for the member `target`: over the
    word `status` (or another call's word, `epoch`) in the worker_epoch's place, so that it
    cannot open a stream nor a stream's proof a Status call."""
    return sign(
        fleet_secret,
        member=STATUS_CALLER,
        epoch=epoch,
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
    target: str | None = None,
) -> dict[str, Any]:
    """The member's view. A mesh with mTLS needs `tls` (a certificate of the fleet's CA);
    one with a fleet secret needs `fleet_secret`, proved for `target`, the member's id (when
    None, learnt from the member's refusal of a call without a proof: module docstring)."""
    async with open_channel(addr, tls, MAX_MESSAGE_BYTES) as channel:
        call = channel.unary_unary(STATUS)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            if fleet_secret is not None and target is None:
                try:
                    data = await call(pack({}), timeout=timeout_s, metadata=_md(None))
                except grpc.RpcError as exc:
                    target = _refused_as(exc)
                    if target is None:
                        raise
                else:
                    return _status(data)
            left = max(0.001, deadline - loop.time())
            md = _md(None if fleet_secret is None else status_proof(fleet_secret, target or ""))
            data = await call(pack({}), timeout=left, metadata=md)
        except grpc.RpcError as exc:
            raise translate(exc, f"status {addr}") from exc
    return _status(data)


def _md(proof: str | None) -> tuple[tuple[str, str], ...]:
    md: tuple[tuple[str, str], ...] = ((MEMBER_MD, STATUS_CALLER),)
    return md if proof is None else (*md, (AUTH_MD, proof))


def _refused_as(exc: grpc.RpcError) -> str | None:
    """The member id a PERMISSION_DENIED refusal names, or None (any other answer)."""
    code = getattr(exc, "code", None)
    if not callable(code) or code() != grpc.StatusCode.PERMISSION_DENIED:
        return None
    trailing = getattr(exc, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == MEMBER_MD and isinstance(value, str) and 0 < len(value) <= 256:
            return value
    return None


def _status(data: bytes) -> dict[str, Any]:
    out = unpack(data, "status")
    if not isinstance(out, dict):
        raise MessageError("status", "the member's answer is not a map")
    return out

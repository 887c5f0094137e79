"""`mesh status`: ask a member for its view over the peer service's Status call."""

from __future__ import annotations

from typing import Any

import grpc

from mesh.config import TlsConfig
from mesh.core.messages import MAX_MESSAGE_BYTES
from mesh.peer._link import open_channel
from mesh.peer._wire import STATUS, pack, translate, unpack

__all__ = ["fetch_status"]


async def fetch_status(
    addr: str, *, tls: TlsConfig | None = None, timeout_s: float = 5.0
) -> dict[str, Any]:
    async with open_channel(addr, tls, MAX_MESSAGE_BYTES) as channel:
        try:
            data = await channel.unary_unary(STATUS)(pack({}), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise translate(exc, f"status {addr}") from exc
    out = unpack(data, "status")
    assert isinstance(out, dict)
    return out

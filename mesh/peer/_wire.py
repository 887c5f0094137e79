"""Names on the wire, and the one place grpc errors become the mesh's error tree."""

from __future__ import annotations

from typing import Any

import grpc
import msgpack

from mesh.core.messages import SCHEMA_VERSION
from mesh.errors import MessageError, PeerError, PeerRefused, PeerUnavailable

__all__ = [
    "EXCHANGE",
    "STATUS",
    "MEMBER_MD",
    "SCHEMA_MD",
    "EPOCH_MD",
    "translate",
    "pack",
    "unpack",
    "channel_options",
]

PEER_SERVICE = "ratemesh.mesh.v1.Peer"
EXCHANGE = f"/{PEER_SERVICE}/Exchange"  # stream: reports in, snapshots back
STATUS = f"/{PEER_SERVICE}/Status"  # unary: the member's view, for `mesh status`
MEMBER_MD = "ratemesh-member"  # the sending member's id, fixed for the stream
SCHEMA_MD = "ratemesh-schema"  # the sender's schema version
EPOCH_MD = "ratemesh-worker-epoch"  # the sender's worker_epoch, fixed for the stream
SCHEMA = str(SCHEMA_VERSION)

_UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
}


def translate(exc: grpc.RpcError, what: str) -> PeerError:
    """A grpc failure as a PeerError naming the call; raise it `from exc`."""
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    name = code.name if code is not None else "UNKNOWN"
    if code is None or code in _UNAVAILABLE:
        return PeerUnavailable(what, f"{name}: {details}")
    return PeerRefused(what, f"{name}: {details}")


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (msgpack.UnpackException, ValueError) as exc:
        raise MessageError(what, f"not valid msgpack: {exc}") from exc


def channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]

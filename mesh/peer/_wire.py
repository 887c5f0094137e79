"""Names on the wire, and the one place grpc errors become the mesh's error tree."""

from __future__ import annotations

from typing import Any

import grpc
import msgpack

from mesh.core.messages import MAX_MESSAGE_BYTES, SCHEMA_VERSION
from mesh.errors import MessageError, PeerError, PeerRefused, PeerUnavailable
from ratemesh import coordinator as coordinator_wire
from ratemesh.unpack import UnpackBounds, unpackb

__all__ = [
    "EXCHANGE",
    "STATUS",
    "FORGET",
    "MEMBER_MD",
    "SCHEMA_MD",
    "EPOCH_MD",
    "translate",
    "translate_status",
    "pack",
    "unpack",
    "channel_options",
    "server_options",
    "KEEPALIVE_MS",
]

PEER_SERVICE = "ratemesh.mesh.v1.Peer"
EXCHANGE = f"/{PEER_SERVICE}/Exchange"  # stream: reports in, snapshots back
STATUS = f"/{PEER_SERVICE}/Status"  # unary: the member's view, for `mesh status`
# unary: purge a decommissioned member's spend-quota cells, for `mesh fleet forget-member`
FORGET = f"/{PEER_SERVICE}/ForgetMember"
MEMBER_MD = "ratemesh-member"  # the sending member's id, fixed for the stream
SCHEMA_MD = "ratemesh-schema"  # the sender's schema version
EPOCH_MD = "ratemesh-worker-epoch"  # the sender's worker_epoch, fixed for the stream
SCHEMA = str(SCHEMA_VERSION)
# What a Status answer (a member's view, up to the message size) may build beyond its bytes
# (ratemesh.unpack): a view lists members, links and policies, thousands of elements.
STATUS_OBJECTS_MAX = 262_144
_BOUNDS = UnpackBounds(
    objects_max=STATUS_OBJECTS_MAX,
    container_max=65_536,
    str_max=MAX_MESSAGE_BYTES,
    bin_max=MAX_MESSAGE_BYTES,
)

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
    return translate_status(code, details, what)


def translate_status(code: grpc.StatusCode | None, details: str, what: str) -> PeerError:
    """A status (None: not known) and its details as a PeerError naming the call."""
    name = code.name if code is not None else "UNKNOWN"
    if code is None or code in _UNAVAILABLE:
        return PeerUnavailable(what, f"{name}: {details}")
    return PeerRefused(what, f"{name}: {details}")


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes, what: str) -> Any:
    try:
        return unpackb(data, _BOUNDS)
    except (msgpack.UnpackException, ValueError) as exc:
        raise MessageError(what, f"not valid msgpack: {exc}") from exc


# Keepalive: a client pings an idle connection every KEEPALIVE_MS (and gives it up after
# KEEPALIVE_TIMEOUT_MS without an answer), so a dead peer's stream ends within 15 s. A server
# must accept those pings: gRPC's default lets a client ping without data only every 5 min and
# answers faster pings with GOAWAY `too_many_pings`, which ended every idle stream (a peer link
# with no reports, a coordinator watch between changes) after its third ping. Servers built with
# `server_options` accept a ping every KEEPALIVE_MS / 2.
KEEPALIVE_MS = coordinator_wire.KEEPALIVE_MS  # shared with governord's server (ratemesh)
KEEPALIVE_TIMEOUT_MS = 5_000


def _common_options(max_message_bytes: int, keepalive_ms: int) -> list[tuple[str, Any]]:
    """What clients and servers both set: message sizes and their own keepalive."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def channel_options(
    max_message_bytes: int, keepalive_ms: int = KEEPALIVE_MS
) -> list[tuple[str, Any]]:
    """A client channel's options (peer links, the coordinator client)."""
    return [
        *_common_options(max_message_bytes, keepalive_ms),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def server_options(
    max_message_bytes: int, keepalive_ms: int = KEEPALIVE_MS
) -> list[tuple[str, Any]]:
    """A server's options: its own keepalive, and room for the clients' pings (above)."""
    return [
        *_common_options(max_message_bytes, keepalive_ms),
        ("grpc.http2.min_ping_interval_without_data_ms", keepalive_ms // 2),
    ]

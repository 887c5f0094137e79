"""Engine outcomes and errors as gRPC status codes, with governord's machine-readable detail
(``governor-error-bin``: reason, message, field, denial, end). The table is in
``docs/governor-api.md``."""

from __future__ import annotations

import hashlib
from typing import Any

import grpc

from governor.engine import (
    AccessError,
    Denial,
    DenyReason,
    GenerationConflict,
    GovernorError,
    InvalidArgument,
    NotFound,
    NotOwner,
    OutOfScope,
    RequestIdReused,
    SessionEnded,
)
from governor.store import StoreError

__all__ = ["Fail", "denial_fail", "error_fail", "key_session_hash", "sha256_hex"]


class Fail(Exception):
    """A reply that is an error status, with the machine-readable detail."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.code = code
        self.detail = {"reason": reason, "message": message, **detail}


_DENY_CODES = {
    DenyReason.QUOTA: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DenyReason.CONCURRENCY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DenyReason.QUEUE_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DenyReason.NODE_ENDED: grpc.StatusCode.FAILED_PRECONDITION,
    DenyReason.SESSION_ENDED: grpc.StatusCode.UNAUTHENTICATED,
    DenyReason.RATE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DenyReason.CREDIT_BLOCKS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DenyReason.NODES: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def denial_fail(d: Denial) -> Fail:
    what = f"{d.reason.value} at node {d.node_id}"
    if d.reason in (DenyReason.QUOTA, DenyReason.CONCURRENCY):
        what += f": {d.resource} {d.used} of {d.limit} used, {d.requested} requested"
    elif d.reason is DenyReason.RATE:
        what += f": {d.resource} has no credit left ({d.used} of burst {d.limit} outstanding)"
    elif d.reason is DenyReason.NODES:
        what += f": the tenant holds {d.used} of at most {d.limit} nodes (nodes_per_tenant_max)"
    elif d.reason is DenyReason.CREDIT_BLOCKS:
        what += f": {d.used} of at most {d.limit} credit blocks outstanding"
    denial = {
        "reason": d.reason.value,
        "node_id": d.node_id,
        "resource": d.resource,
        "used": d.used,
        "limit": d.limit,
        "requested": d.requested,
        "top_consumer": d.top_consumer,
    }
    return Fail(_DENY_CODES[d.reason], "denied", f"denied: {what}", denial=denial)


def error_fail(exc: GovernorError) -> Fail:
    field = getattr(exc, "field", None)
    extra = {"field": field} if field else {}
    if isinstance(exc, RequestIdReused):
        return Fail(grpc.StatusCode.ALREADY_EXISTS, "request_id_reused", str(exc), **extra)
    if isinstance(exc, GenerationConflict):  # a mesh policy put (the coordinator API)
        return Fail(grpc.StatusCode.FAILED_PRECONDITION, "generation_conflict", str(exc), **extra)
    if isinstance(exc, NotFound):
        return Fail(grpc.StatusCode.NOT_FOUND, "not_found", str(exc), **extra)
    if isinstance(exc, InvalidArgument):
        return Fail(grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", str(exc), **extra)
    if isinstance(exc, SessionEnded):
        return Fail(grpc.StatusCode.UNAUTHENTICATED, "session_ended", str(exc))
    if isinstance(exc, OutOfScope):
        return Fail(grpc.StatusCode.PERMISSION_DENIED, "out_of_scope", str(exc))
    if isinstance(exc, NotOwner):
        return Fail(grpc.StatusCode.PERMISSION_DENIED, "not_owner", str(exc))
    if isinstance(exc, AccessError):
        return Fail(grpc.StatusCode.PERMISSION_DENIED, "access", str(exc))
    if isinstance(exc, StoreError):
        return Fail(grpc.StatusCode.UNAVAILABLE, "store", str(exc))
    return Fail(grpc.StatusCode.INTERNAL, "internal", str(exc))


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_session_hash(key_sha256: str) -> str:
    """The token hash of a tenant's bare-API-key session (derived, never a usable token)."""
    return hashlib.sha256(b"governord-key-session:" + key_sha256.encode()).hexdigest()

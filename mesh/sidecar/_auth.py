"""The sidecar's caller check: a bearer token (the sidecar's own `token_file`, else the
fleet secret; docs/sidecar.md). Mutual TLS, where configured, is checked by the handshake
before a call is read."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

__all__ = ["AUTH_HEADER", "BearerCheck"]

AUTH_HEADER = "authorization"  # HTTP header and gRPC metadata key (lower case, as gRPC wants)
_PREFIX = "Bearer "
_TOKEN_MAX_CHARS = 4096


class BearerCheck:
    """None if `authorization: Bearer <token>` holds one of the accepted secrets; else why
    not. With no secrets (loopback, no require_auth) everyone passes."""

    def __init__(self, secrets: Sequence[bytes], required: bool) -> None:
        self.secrets = tuple(secrets)
        self.required = required

    def __call__(self, header: str | bytes | None) -> str | None:
        if not self.required:
            return None
        if header is None:
            return f"{AUTH_HEADER}: required (Bearer <token>)"
        if isinstance(header, bytes):
            header = header.decode("latin-1")
        if len(header) > _TOKEN_MAX_CHARS or not header.startswith(_PREFIX):
            return f"{AUTH_HEADER}: expected 'Bearer <token>'"
        token = header[len(_PREFIX) :].strip().encode("latin-1", "replace")
        # every secret compared, whichever matches: no timing tells which one did
        if not any([hmac.compare_digest(token, s) for s in self.secrets]):
            return f"{AUTH_HEADER}: wrong token"
        return None

"""The SDK's transport: a grpc aio channel, msgpack bodies, status -> SDK error, and resends
with the same request id while governord is unavailable (a restart, a network blip)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from governor import wire

from ._errors import (
    AcquireTimeout,
    AuthError,
    Denied,
    GovernorClientError,
    LeaseEnded,
    NodeEnded,
    RequestError,
    ScopeError,
    SessionLost,
    Unavailable,
)

__all__ = ["Dial", "Rpc", "translate"]

_RESEND = {grpc.StatusCode.UNAVAILABLE}
BACKOFF_MIN_S = 0.02
BACKOFF_MAX_S = 0.5


@dataclass(frozen=True, slots=True)
class Dial:
    """Where and how to reach governord; ``from_env`` reads the GOVERNOR_* variables."""

    addr: str
    api_key: str
    tls: bool = False
    ca_file: str | None = None
    server_name: str | None = None

    @classmethod
    def from_env(
        cls,
        addr: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
        ca_file: str | None = None,
        server_name: str | None = None,
    ) -> Dial:
        env = os.environ
        addr = addr or env.get("GOVERNOR_ADDR") or "127.0.0.1:7443"
        key = api_key or env.get("GOVERNOR_API_KEY")
        if not key:
            raise AuthError("no API key: pass api_key= or set GOVERNOR_API_KEY")
        ca_file = ca_file or env.get("GOVERNOR_CA_FILE")
        if tls is None:
            tls = env.get("GOVERNOR_TLS", "").lower() in ("1", "true", "yes") or bool(ca_file)
        return cls(addr, key, tls, ca_file, server_name)


def translate(err: grpc.RpcError) -> GovernorClientError:
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    detail: dict[str, Any] = {}
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for k, v in trailing or ():
        if k == wire.ERROR_MD and isinstance(v, bytes):
            try:
                got = wire.unpack(v)
                if isinstance(got, dict):
                    detail = got
            except wire.WireError:
                pass
    reason = detail.get("reason", "")
    message = f"{code.name}: {details}"
    name = code.name
    if reason == "denied":
        denial = detail.get("denial") or {}
        if denial.get("reason") == "node_ended":
            return NodeEnded(message, name, detail)
        if denial.get("reason") == "session_ended":
            return SessionLost(message, name, detail)
        return Denied(message, name, detail)
    if reason == "lease_ended":
        return LeaseEnded(message, name, detail)
    if reason == "session_ended":
        return SessionLost(message, name, detail)
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return AuthError(message, name, detail)
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return ScopeError(message, name, detail)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and reason == "timeout":
        return AcquireTimeout(message, name, detail)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(message, name, detail)
    return RequestError(message, name, detail)


class Rpc:
    def __init__(self, dial: Dial) -> None:
        self.dial = dial
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", wire.MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", wire.MESSAGE_BYTES_MAX),
            ("grpc.initial_reconnect_backoff_ms", 20),
            ("grpc.min_reconnect_backoff_ms", 20),
            ("grpc.max_reconnect_backoff_ms", 200),
        ]
        if dial.server_name:
            options.append(("grpc.ssl_target_name_override", dial.server_name))
        if dial.tls:
            ca = Path(dial.ca_file).read_bytes() if dial.ca_file else None
            creds = grpc.ssl_channel_credentials(root_certificates=ca)
            self.channel = aio.secure_channel(dial.addr, creds, options=options)
        else:
            self.channel = aio.insecure_channel(dial.addr, options=options)
        self._calls: dict[str, Any] = {}
        self.token: str | None = None

    def _md(self, auth: str) -> tuple[tuple[str, str], ...]:
        if auth == "token":
            assert self.token is not None
            return ((wire.TOKEN_MD, self.token),)
        return ((wire.KEY_MD, self.dial.api_key),)

    async def call(
        self,
        method: str,
        body: dict[str, Any],
        *,
        auth: str = "token",
        give_up_at: float | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """One call; resent (same body, same request id) while governord is unavailable, until
        ``give_up_at`` (monotonic seconds)."""
        fn = self._calls.get(method)
        if fn is None:
            fn = self._calls[method] = self.channel.unary_unary(wire.path(method))
        data = wire.pack({"v": wire.SCHEMA_VERSION, **body})
        backoff = BACKOFF_MIN_S
        while True:
            try:
                reply = await fn(data, metadata=self._md(auth), timeout=timeout_s)
            except grpc.RpcError as err:
                if err.code() in _RESEND and (give_up_at is None or time.monotonic() < give_up_at):
                    await asyncio.sleep(backoff)
                    backoff = min(BACKOFF_MAX_S, backoff * 2)
                    continue
                raise translate(err) from None
            result = wire.unpack(reply)
            assert isinstance(result, dict)
            return result

    async def stream(self, method: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        fn = self.channel.unary_stream(wire.path(method))
        call = fn(wire.pack({"v": wire.SCHEMA_VERSION, **body}), metadata=self._md("token"))
        try:
            async for item in call:
                yield wire.unpack(item)
        except grpc.RpcError as err:
            raise translate(err) from None

    async def close(self) -> None:
        await self.channel.close()

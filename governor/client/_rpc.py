"""The SDK's transport: a grpc aio channel, msgpack bodies, status -> SDK error, and resends
with the same request id while governord is unavailable (a restart, a network blip).

The short calls travel on Multiplex (``_mux``), many per message; ``OpenSession`` (which
establishes the credentials a stream carries), the waiting ``Acquire`` and the ``WatchNode``
stream are calls of their own. Either way a call has the same answers and the same errors."""

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
from ._mux import CallFailed, Metadata, Mux, status_of

__all__ = ["Dial", "Rpc", "translate", "translate_status"]

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
    failed = status_of(err)
    return translate_status(failed.code, failed.details, failed.detail)


def translate_status(
    code: grpc.StatusCode, details: str, detail: dict[str, Any]
) -> GovernorClientError:
    """A status code and governord's detail map (unary or streamed alike) as an SDK error."""
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
    """Calls to governord. ``multiplex=False`` sends every call on its own (unary) call."""

    def __init__(self, dial: Dial, *, multiplex: bool = True) -> None:
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
        self._muxes: dict[Metadata, Mux] = {}
        self.multiplex = multiplex
        self.token: str | None = None

    def _md(self, auth: str) -> Metadata:
        if auth == "token":
            assert self.token is not None
            return ((wire.TOKEN_MD, self.token),)
        return ((wire.KEY_MD, self.dial.api_key),)

    def _mux(self, method: str, md: Metadata, data: bytes) -> Mux | None:
        """The stream this call travels on, or None for a call of its own."""
        spec = wire.METHODS.get(method)
        if (
            not self.multiplex
            or spec is None
            or not spec.muxable
            or method == "OpenSession"
            or len(data) > wire.MUX_BODY_MAX
        ):
            return None
        mux = self._muxes.get(md)
        if mux is None:
            mux = self._muxes[md] = Mux(self.channel, md)
        return mux

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
        data = wire.pack({"v": wire.SCHEMA_VERSION, **body})
        md = self._md(auth)
        mux = self._mux(method, md, data)
        cid = 0 if mux is None else mux.new_id()
        backoff = BACKOFF_MIN_S
        while True:
            try:
                if mux is not None:
                    return await mux.call(cid, method, data, timeout_s)
                return await self._unary(method, data, md, timeout_s)
            except CallFailed as failed:
                if failed.stream and failed.code is grpc.StatusCode.UNIMPLEMENTED:
                    self.multiplex, mux = False, None  # an older governord: calls of their own
                    continue
                if failed.code in _RESEND and (give_up_at is None or time.monotonic() < give_up_at):
                    await asyncio.sleep(backoff)
                    backoff = min(BACKOFF_MAX_S, backoff * 2)
                    continue
                raise translate_status(failed.code, failed.details, failed.detail) from None

    async def _unary(
        self, method: str, data: bytes, md: Metadata, timeout_s: float | None
    ) -> dict[str, Any]:
        fn = self._calls.get(method)
        if fn is None:
            fn = self._calls[method] = self.channel.unary_unary(wire.path(method))
        try:
            reply = await fn(data, metadata=md, timeout=timeout_s)
        except grpc.RpcError as err:
            raise status_of(err) from None
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
        muxes, self._muxes = list(self._muxes.values()), {}
        for mux in muxes:
            await mux.close()
        await self.channel.close()

"""The SDK's transport: grpc aio channels, msgpack bodies, status -> SDK error, and resends
with the same request id while governord is unavailable (a restart, a network blip, a
takeover: with several addresses, calls follow the leader, see ``leader.LeaderFollower``).

The short calls travel on Multiplex (``_mux``), many per message; ``OpenSession`` (which
establishes the credentials a stream carries), the waiting ``Acquire`` and the ``WatchNode``
stream are calls of their own. Either way a call has the same answers and the same errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from governor import wire
from ratemesh.checks import check_addresses

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
from .leader import RESEND, LeaderFollower

__all__ = ["Dial", "Rpc", "translate", "translate_status"]

# Calls that wait in the leader's memory (its fair queue): one cut by a leader change is not
# resent behind the caller's back (LeaderChanged), see LeaderFollower.call.
_WAITING = frozenset({"Acquire"})
REDIAL_CLOSE_S = 5.0  # channels set aside by `Rpc.redial` close this long after
REDIAL_ASIDE_MAX = 4  # sets of channels set aside at once; past it the oldest closes now


@dataclass(frozen=True, slots=True)
class Dial:
    """Where and how to reach governord; ``from_env`` reads the GOVERNOR_* variables.

    ``addr`` is one ``host:port`` or several, comma-separated: the governords that share one
    record (a leader and its standbys); ``addrs`` is that list. Calls follow the leader.
    A bad list (an empty, malformed or repeated entry, or too many: ``check_addresses``)
    is a ConfigError naming the field."""

    addr: str
    api_key: str
    tls: bool = False
    ca_file: str | None = None
    server_name: str | None = None
    addrs: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        addrs = check_addresses("addr", self.addr)
        object.__setattr__(self, "addrs", addrs)
        object.__setattr__(self, "addr", ",".join(addrs))

    @classmethod
    def from_env(
        cls,
        addr: str | Sequence[str] | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
        ca_file: str | None = None,
        server_name: str | None = None,
    ) -> Dial:
        env = os.environ
        where = "addr" if addr else "GOVERNOR_ADDR"
        addr = addr or env.get("GOVERNOR_ADDR") or "127.0.0.1:7443"
        joined = ",".join(check_addresses(where, addr))
        key = api_key or env.get("GOVERNOR_API_KEY")
        if not key:
            raise AuthError("no API key: pass api_key= or set GOVERNOR_API_KEY")
        ca_file = ca_file or env.get("GOVERNOR_CA_FILE")
        if tls is None:
            tls = env.get("GOVERNOR_TLS", "").lower() in ("1", "true", "yes") or bool(ca_file)
        return cls(joined, key, tls, ca_file, server_name)


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
    """Calls to governord. ``multiplex=False`` sends every call on its own (unary) call.

    With several addresses: one channel each (opened at first use), and calls go to the
    leader as ``follower`` (a ``LeaderFollower``) knows it; an UNAVAILABLE there moves every
    call on, and the call is resent with the same bytes (same request id, which governord
    keeps durably: a call that straddles a takeover takes effect at most once). A Multiplex
    stream belongs to one channel, so a resend on another address travels on that address's
    stream, under a new call id."""

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
        self._options = options
        self._creds: grpc.ChannelCredentials | None = None
        if dial.tls:
            ca = Path(dial.ca_file).read_bytes() if dial.ca_file else None
            self._creds = grpc.ssl_channel_credentials(root_certificates=ca)
        self._channels: dict[int, aio.Channel] = {}
        self.follower = LeaderFollower(dial.addrs)
        self._calls: dict[tuple[int, str], Any] = {}
        self._muxes: dict[tuple[int, Metadata], Mux] = {}
        self.multiplex = multiplex
        self.token: str | None = None
        self._set_aside: list[tuple[list[Mux], list[aio.Channel]]] = []
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def leader(self) -> str:
        """The address calls go to now: the one that answered last, or the next to try."""
        return self.follower.leader

    @property
    def switches(self) -> int:
        """Times calls moved to another address (diagnostics, tests)."""
        return self.follower.switches

    def _channel(self, at: int) -> aio.Channel:
        channel = self._channels.get(at)
        if channel is None:
            addr = self.follower.addrs[at]  # a leader a standby named is learned there
            if self._creds is not None:
                channel = aio.secure_channel(addr, self._creds, options=self._options)
            else:
                channel = aio.insecure_channel(addr, options=self._options)
            self._channels[at] = channel
        return channel

    @property
    def channel(self) -> aio.Channel:
        """The current address's channel."""
        return self._channel(self.follower.current)

    def _md(self, auth: str) -> Metadata:
        if auth == "token":
            if self.token is None:
                raise SessionLost("no session: a call with the session's token before connect")
            return ((wire.TOKEN_MD, self.token),)
        return ((wire.KEY_MD, self.dial.api_key),)

    def _mux(self, at: int, method: str, md: Metadata, data: bytes) -> Mux | None:
        """The stream this call travels on at address ``at``, or None for a call of its own."""
        spec = wire.METHODS.get(method)
        if (
            not self.multiplex
            or spec is None
            or not spec.muxable
            or method == "OpenSession"
            or len(data) > wire.MUX_BODY_MAX
        ):
            return None
        mux = self._muxes.get((at, md))
        if mux is None:
            mux = self._muxes[(at, md)] = Mux(self._channel(at), md)
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
        ``give_up_at`` (monotonic seconds), following the leader among ``dial.addrs``
        (``LeaderFollower.call``: a waiting ``Acquire`` cut by a leader change raises
        LeaderChanged instead)."""
        data = wire.pack({"v": wire.SCHEMA_VERSION, **body})
        md = self._md(auth)
        last: tuple[Mux, int] | None = None

        async def attempt(at: int, attempt_s: float | None) -> dict[str, Any]:
            nonlocal last
            mux = self._mux(at, method, md, data)
            if mux is not None:
                if last is None or last[0] is not mux:
                    last = (mux, mux.new_id())  # a resend on the same stream keeps its id
                try:
                    return await mux.call(last[1], method, data, attempt_s)
                except CallFailed as failed:
                    if not (failed.stream and failed.code is grpc.StatusCode.UNIMPLEMENTED):
                        raise
                    self.multiplex = False  # an older governord: calls of their own
            return await self._unary(at, method, data, md, attempt_s)

        try:
            return await self.follower.call(
                attempt, give_up_at=give_up_at, timeout_s=timeout_s, waits=method in _WAITING
            )
        except CallFailed as failed:
            raise translate_status(failed.code, failed.details, failed.detail) from None

    async def _unary(
        self, at: int, method: str, data: bytes, md: Metadata, timeout_s: float | None
    ) -> dict[str, Any]:
        fn = self._calls.get((at, method))
        if fn is None:
            fn = self._calls[(at, method)] = self._channel(at).unary_unary(wire.path(method))
        try:
            reply = await fn(data, metadata=md, timeout=timeout_s)
        except grpc.RpcError as err:
            raise status_of(err) from None
        return _reply_map(method, reply)

    async def stream(self, method: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """A server stream from the current address; not resent (the caller reopens it), but
        an UNAVAILABLE moves the next call on like a unary one's."""
        follower = self.follower
        at = follower.current
        fn = self._channel(at).unary_stream(wire.path(method))
        call = fn(wire.pack({"v": wire.SCHEMA_VERSION, **body}), metadata=self._md("token"))
        try:
            async for item in call:
                follower.answered = at
                try:
                    reply = _reply_map(method, item)
                except CallFailed as bad:
                    raise translate_status(bad.code, bad.details, bad.detail) from None
                yield reply
        except grpc.RpcError as err:
            failed = status_of(err)
            if failed.code in RESEND and (follower.several or failed.detail.get("leader")):
                follower.moved(at, failed)  # a standby's hint: learned if not given
            raise translate_status(failed.code, failed.details, failed.detail) from None

    def redial(self) -> None:
        """Dial afresh at the next call, without the back-off of a channel that kept failing
        while governord was away (up to its max_reconnect_backoff_ms): the channels and
        their streams are set aside, so every attempt from now, a resend of a call already
        under way included, opens a new one. The old ones close REDIAL_CLOSE_S later, past
        the attempts they carried; past REDIAL_ASIDE_MAX sets aside, the oldest closes now."""
        old = (list(self._muxes.values()), list(self._channels.values()))
        self._muxes, self._channels, self._calls = {}, {}, {}
        # gRPC shares connections (subchannels) between channels of the same target and
        # arguments, so a new channel alone would inherit the old one's back-off: channels
        # from now have their own
        if ("grpc.use_local_subchannel_pool", 1) not in self._options:
            self._options = [*self._options, ("grpc.use_local_subchannel_pool", 1)]
        self._set_aside.append(old)
        self._later(self._close_aside(old, REDIAL_CLOSE_S))
        if len(self._set_aside) > REDIAL_ASIDE_MAX:
            self._later(self._close_set(self._set_aside.pop(0)))

    def _later(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_aside(self, old: tuple[list[Mux], list[aio.Channel]], after_s: float) -> None:
        await asyncio.sleep(after_s)
        if old in self._set_aside:
            self._set_aside.remove(old)
            await self._close_set(old)

    @staticmethod
    async def _close_set(old: tuple[list[Mux], list[aio.Channel]]) -> None:
        for mux in old[0]:
            with contextlib.suppress(Exception):
                await mux.close()
        for channel in old[1]:
            with contextlib.suppress(Exception):
                await channel.close()

    async def close(self) -> None:
        for task in list(self._closing):
            task.cancel()
        aside, self._set_aside = self._set_aside, []
        for old in aside:
            await self._close_set(old)
        muxes, self._muxes = list(self._muxes.values()), {}
        for mux in muxes:
            await mux.close()
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


def _reply_map(method: str, data: bytes) -> dict[str, Any]:
    """governord's reply to ``method``: a map, or CallFailed (INTERNAL, a RequestError to the
    caller) naming what arrived instead."""
    try:
        reply = wire.unpack(data)
    except wire.WireError as exc:
        raise CallFailed(grpc.StatusCode.INTERNAL, f"bad {method} reply: {exc}", {}) from None
    if not isinstance(reply, dict):
        kind = type(reply).__name__
        raise CallFailed(grpc.StatusCode.INTERNAL, f"bad {method} reply: a {kind}, not a map", {})
    return reply

"""The gRPC front end: `ratemesh.sidecar.v1.Admission` (admission.proto) on grpc aio with
generic handlers, on the node's own loop.

A call is checked whole before any item is decided: its bearer token (when the listen
address needs one) from its metadata, by the call guard (`ratemesh.callguard`) before the
call holds a slot or its request is read; then that it decodes as the message, and its
item count (`items_max`). Any of these failing ends the call with UNAUTHENTICATED /
INVALID_ARGUMENT and a message that says what was wrong; nothing was decided. A message
over `max_message_bytes` is refused by grpc itself (RESOURCE_EXHAUSTED); past
`concurrent_max` admitted calls in flight, or a request not sent within
`callguard.FIRST_MESSAGE_S` of the call's headers, the guard ends the call
(RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED), counted in `refused`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from mesh.config import SidecarConfig, TlsConfig, is_loopback
from mesh.core.verdict import Numbers, Verdict
from mesh.peer import bind_port
from mesh.sidecar import admission_pb2 as pb
from mesh.sidecar._auth import AUTH_HEADER, BearerCheck
from mesh.sidecar._envoy import EnvoyRls, add_rls
from mesh.sidecar._items import (
    Decider,
    Item,
    Outcome,
    limit_fields,
    quota_fields,
    shared_fields,
)
from mesh.sidecar._slots import SlotKeeper, SlotTokens
from mesh.sidecar._slots_grpc import CONCURRENCY_SERVICE, slot_handlers
from mesh.sidecar._wait import timeout_problem, waiting_for
from ratemesh import callguard
from ratemesh.callguard import Caller, CallGuard, GuardLimits, Refused
from ratemesh.checks import with_port
from ratemesh.grpcstd import Ready, add_standard_services, open_health
from ratemesh.policy import TenantRatePolicy

__all__ = ["ADMISSION_SERVICE", "GrpcSidecar", "encode_outcomes"]

log = logging.getLogger("mesh.sidecar")
ADMISSION_SERVICE = "ratemesh.sidecar.v1.Admission"
_ENCODED_MAX = 4096  # encoded verdicts kept (verdicts are shared values; few distinct ones)
# id(verdict) -> (the verdict, its encoding). Keeping the verdict keeps its id from being
# reused while the entry lives, and `is` confirms it: an identity lookup, cheaper than the
# dataclass's hash of five fields. A verdict built per call (fields per key) just misses.
_encoded: dict[int, tuple[Verdict, bytes]] = {}


def _varint_of(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Varints below 2^14 (one or two bytes: lengths, remaining counts, waits in ms), made once,
# and every 14-bit group as the two bytes it is inside a longer varint (both continued).
_SMALL_VARINTS = tuple(_varint_of(i) for i in range(1 << 14))
_MID_GROUPS = tuple(bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(1 << 14))


def _varint(n: int) -> bytes:
    """`n` (>= 0) as a protobuf varint, 14 bits a table lookup (test_proto pins it)."""
    if n < 16384:
        return _SMALL_VARINTS[n]
    out = b""
    while n >= 16384:
        out += _MID_GROUPS[n & 0x3FFF]
        n >>= 14
    return out + _SMALL_VARINTS[n]


def _framed(tag: int, payload: bytes) -> bytes:
    """One length-delimited field (`tag` is its first byte): how a repeated message
    field is encoded, so a response is its items' encodings joined."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _shared_bytes(v: Verdict) -> bytes:
    """A shared verdict's fields 1-7 as the Verdict message encodes them, memoised per
    verdict object (shared verdicts are interned: a small, bounded set)."""
    hit = _encoded.get(id(v))
    if hit is not None and hit[0] is v:
        return hit[1]
    data: bytes = pb.Verdict(**shared_fields(v)).SerializeToString()
    if len(_encoded) >= _ENCODED_MAX:
        _encoded.clear()
    _encoded[id(v)] = (v, data)
    return data


# The per-moment numbers are fields 8, 9 and 10 (int64, varint): tags 0x40, 0x48, 0x50.
_INT64 = (1 << 64) - 1


def _verdict_bytes(v: Verdict, n: Numbers | None, limit: bytes = b"") -> bytes:
    """AdmitResponse's field 1 holding `v` with the numbers `n`: the memoised shared part
    and the numbers appended as protobuf encodes them (fields in order, absent if None;
    test_proto pins this to the generated encoder)."""
    # a detailed quota verdict is fresh each time: its shared part is memoised as the
    # interned verdict's, so the memo holds only interned verdicts
    body = _shared_bytes(v if v.quota is None else v.shared())
    if n is None:  # a detailed verdict carries its own
        n = Numbers(v.remaining, v.retry_after_ms, v.reset_after_ms)
    remaining, retry, reset = n
    if remaining is not None:
        body += b"\x40" + _varint(remaining & _INT64)
    if retry is not None:
        body += b"\x48" + _varint(retry & _INT64)
    if reset is not None:
        body += b"\x50" + _varint(reset & _INT64)
    if v.quota is not None:  # field 13, a QuotaLag message: after the numbers, in order
        lag = pb.QuotaLag(**quota_fields(v.quota)).SerializeToString()
        body += b"\x6a" + _varint(len(lag)) + lag
    # fields 14-16, the policy's exact limit (`limit_bytes`): last, in order
    return b"\x0a" + _varint(len(body) + len(limit)) + body + limit


def encode_outcomes(outcomes: list[Outcome], limits: Sequence[bytes] = ()) -> bytes:
    """An AdmitResponse, one Verdict per outcome in order (an error one for a bad item);
    ``limits``: each decided item's `limit_bytes` (none given: no limit fields)."""
    parts = []
    for k, o in enumerate(outcomes):
        if isinstance(o, str):
            err = pb.Verdict(allowed=False, error=o).SerializeToString()
            parts.append(_framed(0x0A, err))
        else:
            parts.append(_verdict_bytes(o[0], o[1], limits[k] if limits else b""))
    return b"".join(parts)


LIMIT_FIELDS = ("burst", "window", "rate")  # Verdict fields 14-16: the policy's exact limit
_limits: dict[int, tuple[TenantRatePolicy, bytes]] = {}
_LIMITS_MAX = 4096  # policies whose limit fields are kept encoded


def limit_bytes(policy: TenantRatePolicy | None) -> bytes:
    """Verdict fields 14-16 (`burst`, `window`, `rate`: `limit_fields`, as the HTTP verdict
    carries them) for ``policy``, memoised per policy object (policies are immutable); b""
    for none or a spend quota."""
    if policy is None:
        return b""
    hit = _limits.get(id(policy))
    if hit is not None and hit[0] is policy:
        return hit[1]
    fields = limit_fields(policy)
    data: bytes = b""
    if fields:
        window = pb.Window(**fields["window"])
        msg = pb.Verdict(burst=fields["burst"], window=window, rate=fields["rate"])
        data = msg.SerializeToString()
    if len(_limits) >= _LIMITS_MAX:
        _limits.clear()
    _limits[id(policy)] = (policy, data)
    return data


def _encode_acks(errors: list[str | None]) -> bytes:
    resp = pb.RefundResponse()
    for e in errors:
        if e is None:
            resp.acks.add(ok=True)
        else:
            resp.acks.add(ok=False, error=e)
    data: bytes = resp.SerializeToString()
    return data


def _items(data: bytes, items_max: int) -> Iterator[Item]:
    """The call's items (read as they are decided), or ValueError saying why the call as a
    whole is refused: checked before the first item is read."""
    return _request(data, items_max)[0]


def _request(data: bytes, items_max: int) -> tuple[Iterator[Item], int]:
    """The call's items and its ``timeout_ms`` (0: answer at once), or ValueError."""
    try:
        req = pb.AdmitRequest.FromString(data)
    except DecodeError as exc:
        raise ValueError(f"AdmitRequest: not a valid message ({exc})") from None
    n = len(req.items)
    if n > items_max:
        raise ValueError(f"items: {n} in one call; at most {items_max} (split the batch)")
    why = timeout_problem(req.timeout_ms)
    if why is not None:
        raise ValueError(why)
    return _rows(req.items), req.timeout_ms


def _rows(items: Iterable[pb.AdmitItem]) -> Iterator[Item]:
    # Plain tuples in Item's order (a NamedTuple's constructor costs a call per item).
    for it in items:
        # amount 0 is "absent" unless it was sent (proto3 optional): absent means 1
        amount = it.amount or (0 if it.HasField("amount") else 1)
        ds = it.descriptors
        yield (it.tenant, it.metric, amount, [(d.key, d.value) for d in ds] if ds else ())  # type: ignore[misc]


class GrpcSidecar:
    def __init__(
        self,
        decider: Decider,
        config: SidecarConfig,
        *,
        tls: TlsConfig | None,
        fleet_secrets: tuple[bytes, ...],
        envoy: EnvoyRls | None = None,
        ready: Ready = lambda: True,
    ) -> None:
        assert config.grpc_listen is not None
        self.envoy = envoy  # Envoy's RateLimitService beside Admission (envoy_rls)
        self.ready = ready  # whether the node has policies to decide with
        self.listen = config.grpc_listen
        self.config = config
        self.decider = decider
        needs = config.needs_auth(self.listen)
        self.auth = BearerCheck(fleet_secrets, required=needs and bool(fleet_secrets))
        # TLS where the address leaves the host and the node has it: the peer port's files
        self.tls = tls if tls is not None and not is_loopback(self.listen) else None
        self._server: aio.Server | None = None
        self.calls = 0
        self.refused = 0
        self.address = ""
        self.slot_tokens: SlotTokens | None = None

    async def start(self) -> str:
        limit = self.config.max_message_bytes
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ]
        n = self.config.concurrent_max
        self.guard = CallGuard(
            open_health(self._identify),
            GuardLimits(calls_max=n, caller_calls_max=n),
            on_refused=self._guard_refused,
        )
        options += callguard.server_options()
        server = aio.server(options=options, interceptors=(self.guard,))
        rpc = {
            "Admit": grpc.unary_unary_rpc_method_handler(self._admit),
            "Charge": grpc.unary_unary_rpc_method_handler(self._charge),
            "Refund": grpc.unary_unary_rpc_method_handler(self._refund),
            "AdmitStream": grpc.stream_stream_rpc_method_handler(self._admit_stream),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(ADMISSION_SERVICE, rpc),)
        )
        server.add_generic_rpc_handlers((slot_handlers(self._slot_tokens, AUTH_HEADER),))
        rls = add_rls(server, self.envoy)
        rls[CONCURRENCY_SERVICE] = self.ready  # in-flight slots (mesh.sidecar._slots_grpc)
        add_standard_services(server, {ADMISSION_SERVICE: self.ready, **rls})
        port = await bind_port(server, self.listen, self.tls, field="sidecar.grpc_listen")
        await server.start()
        self._server = server
        self.address = with_port(self.listen, port)
        return self.address

    def _slot_tokens(self) -> SlotTokens:
        """The slot tokens this port handed out (made on the first Acquire)."""
        if self.slot_tokens is None:
            self.slot_tokens = SlotTokens(cast(SlotKeeper, self.decider.admitter))
        return self.slot_tokens

    async def stop(self, grace_s: float) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    # -- handlers -------------------------------------------------------------------------

    def _identify(
        self, method: str, md: callguard.Metadata, context: aio.ServicerContext[bytes, bytes]
    ) -> Caller:
        """The guard's check, before the call holds anything: an accepted token where one
        is required. Every caller holding it is one caller (the token names no one)."""
        why = self.auth(md.get(AUTH_HEADER))
        if why is not None:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, why, "unauthenticated")
        return Caller("token" if self.auth.required else "anyone")

    def _guard_refused(self, exc: Refused, context: aio.ServicerContext[bytes, bytes]) -> None:
        self.refused += 1

    async def _checked(
        self, data: bytes, context: aio.ServicerContext[bytes, bytes]
    ) -> Iterator[Item]:
        self.calls += 1
        return await self._read(data, context)

    async def _read(
        self, data: bytes, context: aio.ServicerContext[bytes, bytes]
    ) -> Iterator[Item]:
        """The message's items, or abort INVALID_ARGUMENT saying why (nothing decided)."""
        return (await self._read_request(data, context))[0]

    async def _read_request(
        self, data: bytes, context: aio.ServicerContext[bytes, bytes]
    ) -> tuple[Iterator[Item], int]:
        """The message's items and ``timeout_ms``, or abort INVALID_ARGUMENT saying why."""
        try:
            return _request(data, self.config.items_max)
        except ValueError as exc:
            self.refused += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise AssertionError("unreachable: abort raises")

    async def _admit(self, data: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        self.calls += 1
        rows, timeout_ms = await self._read_request(data, context)
        return await self._decided(list(rows), timeout_ms, charge=False)

    async def _decided(self, items: list[Item], timeout_ms: int, *, charge: bool) -> bytes:
        """An AdmitResponse for ``items``, waiting up to ``timeout_ms`` (`mesh.sidecar._wait`),
        each decided verdict with its policy's exact limit."""
        decider = self.decider
        if timeout_ms:
            waiting = waiting_for(decider)
            outcomes = await waiting.admit(decider, items, charge=charge, timeout_ms=timeout_ms)
        else:
            outcomes = decider.admit(items, charge=charge)
        limits = [
            b""
            if isinstance(o, str) or o[0].mode is None
            else limit_bytes(decider.policy(Item(*it)))
            for it, o in zip(items, outcomes, strict=True)
        ]
        return encode_outcomes(outcomes, limits)

    async def _admit_stream(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        """One AdmitResponse per AdmitRequest, in order, until the caller closes its side.
        The token is checked once, when the stream opens (the guard); a malformed message
        ends the stream INVALID_ARGUMENT (the batches before it were decided and answered)."""
        self.calls += 1
        async for data in requests:
            rows, timeout_ms = await self._read_request(data, context)
            yield await self._decided(list(rows), timeout_ms, charge=False)

    async def _charge(self, data: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        self.calls += 1
        rows, timeout_ms = await self._read_request(data, context)
        return await self._decided(list(rows), timeout_ms, charge=True)

    async def _refund(self, data: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        return _encode_acks(self.decider.refund(await self._checked(data, context)))

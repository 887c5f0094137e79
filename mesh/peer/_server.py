"""The peer service every worker runs: reports arrive on long-lived streams, snapshots go
back on the streams their receiver opened (so they reach active reporters only): on every
live stream of that member, each with its own queue, so that no other stream under the
member's id (a second one, a newer worker_epoch, one that closes) can take them away.

Every call is admitted by the call guard (`ratemesh.callguard`) as its headers arrive, from
`_identify`: a Status call's proof, or a stream's open checks below, before the call holds a
slot or a byte of its request is read. A stream is admitted, in this order: its metadata
(schema, member id, worker_epoch), the member's proof of identity (client certificate and/or
fleet secret, `_identity.py`), ring membership (the node's `is_member`: its ring, or departed
from it within the owner's grace), then the stream bounds (`STREAMS_PER_PEER_MAX`,
`STREAMS_MAX`). Membership is checked at open only: a member that leaves the ring keeps its
open stream, and the owner refuses its reports (`not_member`) once its grace has passed.

Every request is decoded and validated before anything sees it. A malformed message, one
from a different sender than the stream's, or one of another schema or worker_epoch ends
the stream with a clear status (INVALID_ARGUMENT / FAILED_PRECONDITION) and changes
nothing; an oversized one is refused by grpc itself (RESOURCE_EXHAUSTED). Refusals are
counted per reason (`_identity.REASONS`) and logged at most once a second as warnings.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc
from grpc import aio

from mesh.config import TlsConfig
from mesh.core.messages import (
    CellPublish,
    CooldownReport,
    Handover,
    Message,
    ReportBatch,
    decode,
)
from mesh.errors import MeshError, MessageError
from mesh.peer._identity import (
    AUTH_MD,
    FORGET_EPOCH,
    REASONS,
    STATUS_EPOCH,
    NonceMemory,
    RefusalLog,
    certificate_names,
    check_certificate,
    check_mac,
)
from mesh.peer._tls import bind_port
from mesh.peer._wire import (
    EPOCH_MD,
    EXCHANGE,
    FORGET,
    MEMBER_MD,
    PEER_SERVICE,
    SCHEMA,
    SCHEMA_MD,
    STATUS,
    pack,
    server_options,
    unpack,
)
from ratemesh import callguard
from ratemesh.callguard import Caller, CallGuard, GuardLimits
from ratemesh.callguard import Refused as _Refused
from ratemesh.grpcstd import add_standard_services, is_standard, open_health

__all__ = [
    "CALLS_MAX",
    "CALLER_CALLS_MAX",
    "PeerHandler",
    "PeerServer",
    "STREAM_QUEUE_MAX",
    "STREAMS_MAX",
    "STREAMS_PER_PEER_MAX",
]

log = logging.getLogger("mesh.peer")
STREAM_QUEUE_MAX = 1024  # snapshot batches waiting for one receiver's stream; then dropped
# Concurrent inbound Exchange streams. A member needs one (its reconnect's new stream takes
# the snapshots; the old one ends when grpc sees its connection gone, keepalive <= 15 s), so
# four leave room for reconnects; in all, counted after identity and membership, so a ring of
# N members can hold at most 4 x N of them.
STREAMS_PER_PEER_MAX = 4
STREAMS_MAX = 1024
# Calls admitted at once (`ratemesh.callguard`, after the caller proved itself): the
# streams above plus Status calls; past it RESOURCE_EXHAUSTED, counted `call_limit`. A call
# that proves nothing is refused before it holds anything, so it never counts here.
CALLS_MAX = STREAMS_MAX + 64
# Of them, one caller's: a member's streams (STREAMS_PER_PEER_MAX of them, checked below) or
# the Status calls of `mesh status` (every such caller is one: it proves the secret, no more).
CALLER_CALLS_MAX = 16
# The longest member id a ForgetMember request may name (a DNS name is at most 253).
MEMBER_NAME_MAX = 256

# Answers whether a member id may open a stream: None while the node has no ring yet.
IsMember = Callable[[str], bool | None]


class _Inbound:
    """One open Exchange stream: its snapshot queue, its task, and whether it has carried a
    message yet (a silent one can be displaced by a newer stream of its member)."""

    __slots__ = ("queue", "task", "spoke", "displaced")

    def __init__(self, queue: asyncio.Queue[bytes], task: asyncio.Task[Any] | None) -> None:
        self.queue = queue
        self.task = task
        self.spoke = False
        self.displaced = False


class PeerHandler(Protocol):
    def deliver(self, message: Message) -> None: ...

    def link_reset(self, peer: str) -> None: ...

    def status(self) -> dict[str, Any]: ...


class PeerServer:
    """grpc aio server with generic handlers; bytes in, bytes out, the codec is ours."""

    def __init__(
        self,
        handler: PeerHandler,
        listen: str,
        *,
        tls: TlsConfig | None,
        max_message_bytes: int,
        extra_handlers: tuple[grpc.GenericRpcHandler, ...] = (),
        member_id: str = "",
        fleet_secrets: tuple[bytes, ...] = (),
        is_member: IsMember | None = None,
    ) -> None:
        self.handler = handler
        self.listen = listen
        self.tls = tls
        self.max_message_bytes = max_message_bytes
        self.member_id = member_id  # what a fleet-secret proof must name as its target
        self.fleet_secrets = fleet_secrets  # any of them proves membership; () none needed
        self.is_member = is_member  # None: no ring check (a bare server in a test or bench)
        self._extra = extra_handlers
        self._server: aio.Server | None = None
        # Every live stream of a member, each with its own queue: a snapshot batch goes to
        # all of them, so no stream (a second one under the member's id, a newer
        # worker_epoch, one that closes) can take the snapshots from another. At most
        # STREAMS_PER_PEER_MAX queues per member, STREAMS_MAX in all.
        self._streams: dict[str, list[_Inbound]] = {}
        self._open_by_member: dict[str, int] = {}  # at most STREAMS_MAX entries
        self.open_streams = 0
        self.streams_max = STREAMS_MAX
        self.streams_per_peer_max = STREAMS_PER_PEER_MAX
        self._nonces = NonceMemory()
        self._log = RefusalLog(log)
        self.accepting = True
        self.refused_by = dict.fromkeys(REASONS, 0)
        self.received = 0
        self.snapshots_dropped = 0
        self.displaced = 0  # silent streams ended to let a newer one of their member in

    @property
    def refused(self) -> int:
        """Streams refused or ended by this server, all reasons."""
        return sum(self.refused_by.values())

    async def start(self) -> int:
        # grpc sets SO_REUSEPORT by default: a second node on this port would bind beside
        # the first and take half its peers' streams; refused, it fails with `listen`
        options = [*server_options(self.max_message_bytes), ("grpc.so_reuseport", 0)]
        self.guard = CallGuard(
            open_health(self._identify),
            GuardLimits(calls_max=CALLS_MAX, caller_calls_max=CALLER_CALLS_MAX),
            on_refused=self._guard_refused,
        )
        options += callguard.server_options()
        server = aio.server(options=options, interceptors=(self.guard,))
        rpc: dict[str, grpc.RpcMethodHandler] = {
            "Exchange": grpc.stream_stream_rpc_method_handler(self._exchange),
            "Status": grpc.unary_unary_rpc_method_handler(self._status),
            "ForgetMember": grpc.unary_unary_rpc_method_handler(self._forget_member),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(PEER_SERVICE, rpc), *self._extra)
        )
        add_standard_services(server, {PEER_SERVICE: lambda: self.accepting})
        port = await bind_port(server, self.listen, self.tls, field="listen")
        await server.start()
        self._server = server
        return port

    def send(self, member: str, data: bytes) -> bool:
        """Queue a snapshot batch on every live stream of `member`; False if it has none
        (or all of them are full)."""
        streams = self._streams.get(member)
        sent = False
        if streams is not None:
            for s in streams:
                q = s.queue
                if not q.full():
                    q.put_nowait(data)
                    sent = True
        if not sent:
            self.snapshots_dropped += 1
        return sent

    def streams(self) -> list[str]:
        return sorted(self._streams)

    async def stop(self, grace_s: float) -> None:
        """Refuse new streams, give open ones `grace_s` to finish, then cancel them."""
        self.accepting = False
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    # -- handlers -------------------------------------------------------------------------

    def _identify(
        self, method: str, md: callguard.Metadata, context: aio.ServicerContext[bytes, bytes]
    ) -> Caller:
        """Who a call is from, proved, before it is given anything (`ratemesh.callguard`);
        raises the refusal (counted by the guard, through `_guard_refused`)."""
        if method == EXCHANGE:
            member, epoch = self._open(context)
            return Caller(f"member:{member}", (member, epoch))
        if method == STATUS:
            try:
                self._status_caller(context)
            except _Refused as exc:
                # Who to prove to: a caller that knows only an address asks without a proof
                # and signs its second call for this id (`_status.fetch_status`).
                raise _Refused(
                    exc.code, exc.details, exc.reason, ((MEMBER_MD, self.member_id),)
                ) from None
            return Caller("status")
        if method == FORGET:  # proved as a Status caller is, over its own word
            self._status_caller(context, FORGET_EPOCH)
            return Caller("admin")
        if is_standard(method):  # health Watch, reflection: proved as a Status caller is
            self._status_caller(context)
            return Caller("standard")
        return Caller(f"extra:{method}")  # an extra handler checks its own callers

    def _guard_refused(self, exc: _Refused, context: aio.ServicerContext[bytes, bytes]) -> None:
        claimed = dict(context.invocation_metadata() or ()).get(MEMBER_MD)
        self._refuse(exc, context.peer(), str(claimed)[:256])

    async def _status(self, request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        """The member's view, for a caller proved as streams are (`_identity`; checked by
        `_identify` before the request was read)."""
        return pack(self.handler.status())

    async def _forget_member(
        self, request: bytes, context: aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        """Purge a decommissioned member's spend-quota cells by name (the folds this member
        owns and the shared-state tier's), for a caller proved as a Status caller is."""
        forget = getattr(self.handler, "forget_member", None)
        if not callable(forget):
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "forget_member: not served here")
            raise AssertionError("abort raises")  # for the type checker
        try:
            body = unpack(request, "forget_member")
            name = body.get("member") if isinstance(body, dict) else None
            if not isinstance(name, str) or not 0 < len(name) <= MEMBER_NAME_MAX:
                raise MessageError("member", "must be a member id of 1..256 characters")
            answer = await forget(name)
        except MeshError as exc:  # a mistake in the request: named, nothing changed
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pack(answer)

    def _status_caller(
        self, context: aio.ServicerContext[bytes, bytes], epoch: str = STATUS_EPOCH
    ) -> None:
        """Raise _Refused unless the Status caller proves itself: a client certificate
        where mTLS is required (the handshake checked its CA; any fleet certificate may
        ask), a fleet-secret proof where the mesh has a secret. With neither configured (a
        dev mesh) anyone may ask, as anyone may open a stream."""
        if self.tls is not None and self.tls.require_client_cert:
            sans, cn = certificate_names(context.auth_context())
            if not sans and cn is None:
                raise _Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "status: the caller presented no client certificate",
                    "bad_certificate",
                )
        if not self.fleet_secrets:
            return
        md = {k: v for k, v in (context.invocation_metadata() or ())}
        caller, proof = md.get(MEMBER_MD), md.get(AUTH_MD)
        if not isinstance(caller, str) or not caller or len(caller) > 256:
            caller = ""
        if proof is None:  # not a forgery: a caller asking whom to prove to; not counted
            raise _Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"status: {AUTH_MD}: metadata is required (this mesh has a fleet secret)",
            )
        # Proved for this member only: a proof names its target, so one captured here
        # cannot be replayed at another member, nor (the nonces) here again.
        why = self._check_proof(proof, caller, epoch, self.member_id)
        if why is not None:
            raise _Refused(grpc.StatusCode.PERMISSION_DENIED, f"status: {why}", "bad_secret")

    def _check_proof(self, proof: object, member: str, epoch: str, target: str) -> str | None:
        """Why the fleet-secret `proof` (metadata, untrusted) does not prove `member` at
        `epoch` to `target` now, or None; a proof is good once (the nonces remembered)."""
        return check_mac(
            self.fleet_secrets,
            proof if isinstance(proof, str) else None,
            member=member,
            epoch=epoch,
            schema=SCHEMA,
            target=target,
            now_s=int(time.time()),
            seen=self._nonces,
        )

    def _open(self, context: aio.ServicerContext[bytes, bytes]) -> tuple[str, int]:
        """Admit a stream (module docstring) or raise _Refused; no await, nothing kept."""
        if not self.accepting:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, "member is shutting down")
        md = {k: v for k, v in (context.invocation_metadata() or ())}
        if md.get(SCHEMA_MD) != SCHEMA:
            raise _Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"schema: unsupported schema version {md.get(SCHEMA_MD)!r}; "
                f"this peer speaks {SCHEMA}",
                "bad_message",
            )
        member, epoch = md.get(MEMBER_MD), md.get(EPOCH_MD)
        if not isinstance(member, str) or not member or len(member) > 256:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{MEMBER_MD}: metadata is required (the sending member's id)",
                "bad_message",
            )
        if not isinstance(epoch, str) or not epoch.isdigit() or len(epoch) > 20:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{EPOCH_MD}: metadata is required (the sender's worker_epoch)",
                "bad_message",
            )
        if self.tls is not None and self.tls.require_client_cert:
            why = check_certificate(context.auth_context(), member)
            if why is not None:
                raise _Refused(grpc.StatusCode.PERMISSION_DENIED, why, "bad_certificate")
        if self.fleet_secrets:
            proof = md.get(AUTH_MD)
            why = self._check_proof(proof, member, epoch, self.member_id)
            if why is not None:
                raise _Refused(grpc.StatusCode.PERMISSION_DENIED, why, "bad_secret")
        if self.is_member is not None:
            known = self.is_member(member)
            if known is None:
                raise _Refused(grpc.StatusCode.UNAVAILABLE, "member is starting (no ring yet)")
            if not known:
                raise _Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{MEMBER_MD}: {member!r} is not a member of this member's ring",
                    "not_member",
                )
        if self.open_streams >= self.streams_max:
            raise _Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this member has {self.open_streams} open peer streams "
                f"(STREAMS_MAX {self.streams_max})",
                "stream_limit",
            )
        held = self._open_by_member.get(member, 0)
        if held >= self.streams_per_peer_max and not self._displace(member):
            raise _Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{member!r} already has {held} open streams to this member "
                f"(STREAMS_PER_PEER_MAX {self.streams_per_peer_max})",
                "stream_limit",
            )
        return member, int(epoch)

    def _displace(self, member: str) -> bool:
        """End `member`'s oldest stream that has carried no message, to let a newer one in;
        False if every one has. Streams held open and silent under a member's id (by anyone
        holding the fleet secret) then cannot keep the member's reconnect out, and a stream
        that carries the member's reports is never ended for another."""
        for s in self._streams.get(member, ()):
            if not s.spoke and not s.displaced and s.task is not None:
                s.displaced = True
                s.task.cancel()
                self.displaced += 1
                return True
        return False

    def _refuse(self, exc: _Refused, peer: str, member: str) -> None:
        if exc.reason is None:
            return
        self.refused_by[exc.reason] += 1
        self._log.refused(time.monotonic(), exc.reason, peer, member, exc.details)

    def _check(self, data: bytes, member: str, epoch: int) -> Message:
        try:
            msg = decode(data, max_bytes=self.max_message_bytes)
        except MessageError as exc:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        if isinstance(msg, Handover):  # a leaving owner's keys; the owner checks the rest
            if msg.sender != member:
                raise _Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"sender: {msg.sender!r} is not this stream's member {member!r}",
                )
            return msg
        if isinstance(msg, (CellPublish, CooldownReport)):  # cells, 429s: the sender's own
            if msg.sender != member:
                raise _Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"sender: {msg.sender!r} is not this stream's member {member!r}",
                )
            return msg
        if not isinstance(msg, ReportBatch):
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "kind: only report batches, cell publishes, cooldown reports and hand-overs "
                "may be sent on this stream",
            )
        if msg.sender != member:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"sender: {msg.sender!r} is not this stream's member {member!r}",
            )
        if msg.worker_epoch != epoch:
            raise _Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"worker_epoch: {msg.worker_epoch} is not this stream's worker_epoch {epoch}",
            )
        return msg

    async def _exchange(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext[bytes, bytes]
    ) -> None:
        member, epoch = callguard.caller()  # admitted by `_identify` (`_open`), no await since
        self.open_streams += 1
        self._open_by_member[member] = self._open_by_member.get(member, 0) + 1
        queue: asyncio.Queue[bytes] = asyncio.Queue(STREAM_QUEUE_MAX)
        inbound = _Inbound(queue, asyncio.current_task())
        self._streams.setdefault(member, []).append(inbound)  # one more that gets snapshots
        writer: asyncio.Task[None] | None = None
        refused: _Refused | None = None
        try:
            # headers at once tell the opener its stream was admitted (PeerLink awaits
            # them before it counts itself connected); a refused one gets only a status
            await context.send_initial_metadata(())
            writer = asyncio.get_running_loop().create_task(_write(queue, context.write))
            async for data in requests:
                try:
                    msg = self._check(data, member, epoch)
                except _Refused as exc:
                    # a copy without the traceback: kept past the except block, the raised
                    # one would tie this frame (and the refused message's bytes) in a cycle
                    # that only a full collection frees (1 MiB per refused stream)
                    refused = _Refused(exc.code, exc.details, "bad_message")
                    break
                self.received += 1
                inbound.spoke = True
                self.handler.deliver(msg)
                # Let the loop turn between two messages: messages grpc holds already are
                # read without a pause, so a burst of them (each within its bound) would
                # otherwise hold the loop, timers and other peers for all of them.
                await asyncio.sleep(0)
        finally:
            if writer is not None:
                writer.cancel()
            streams = self._streams[member]
            streams.remove(inbound)  # this stream's own queue, never another stream's
            if not streams:
                del self._streams[member]
            self.open_streams -= 1
            left = self._open_by_member[member] - 1
            if left:
                self._open_by_member[member] = left
            else:
                del self._open_by_member[member]
        if refused is not None:
            self._refuse(refused, context.peer(), member)
            await context.abort(refused.code, refused.details)


async def _write(queue: asyncio.Queue[bytes], write: Callable[[bytes], Any]) -> None:
    try:
        while True:
            data = await queue.get()
            await write(data)
    except Exception:  # noqa: BLE001 - the stream ended under us; its reader finishes it
        return

"""The client of the coordinator API over gRPC (put a policy as a new generation, list,
watch, history): `PolicySource` against governord.

governord serves this API durably, with API keys and scopes (docs/policies.md); an
in-process one for tests and benches is `mesh.testing.coordinator.CoordinatorServer`. The
wire shapes are shared with governord: `ratemesh.coordinator`. With several governords (a
leader and its standbys) calls follow the leader as the SDK's do:
`governor.client.leader.LeaderFollower`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from governor.client.leader import CallFailed, LeaderFollower, status_of
from mesh.config import TlsConfig
from mesh.coordinator import PolicySnapshot
from mesh.core.messages import MAX_MESSAGE_BYTES
from mesh.core.policy import TenantRatePolicy
from mesh.errors import ConfigError, MessageError, PeerUnavailable
from mesh.peer._link import open_channel
from mesh.peer._wire import channel_options, pack, translate_status, unpack
from ratemesh.checks import check_addresses
from ratemesh.coordinator import (
    API_KEY_MD,
    COORDINATOR_SERVICE,
    HistoryEntry,
    Tombstone,
    method_path,
)

__all__ = ["COORDINATOR_SERVICE", "PutResult", "CoordinatorClient"]

# the most lines of a put's `disagreements` kept (each names one watching node)
DISAGREEMENTS_SHOWN_MAX = 64


@dataclass(frozen=True, slots=True)
class PutResult:
    """What a put became: the stored generation, the coordinator's revision after it, and
    whether it was new (False: the same values under that generation were already there)."""

    policy: TenantRatePolicy
    revision: int
    created: bool
    # watching nodes that load this generation from their own files with other values (they
    # will refuse it), as governord names them; empty from a coordinator that does not say
    disagreements: tuple[str, ...] = ()

    @property
    def generation(self) -> int:
        """The stored generation (what callers that only push want)."""
        return self.policy.generation


class CoordinatorClient:
    """`PolicySource` over gRPC, plus the writes a coordinator makes (put, remove) and the
    history. `api_key` names the caller to governord (a worker's key may list, watch and read
    history; a coordinator's may write). Errors arrive as PeerUnavailable/PeerRefused; a
    refusal's message is governord's, naming what was wrong.

    `addr` may name several governords ("a:1,b:2" or a sequence; ConfigError naming `addr`
    for a bad one: `ratemesh.checks.check_addresses`): a leader and its standbys.
    A call that finds governord unavailable is resent, following the leader (a standby
    answers `not_leader` with a hint) and backing off, until `timeout_s` after it began,
    as the SDK's calls are (`LeaderFollower`): an election or a restart is ridden out. A
    watch whose stream breaks reopens the same way, from the last revision it yielded. A
    put resent after a lost reply is stored once when it names its generation (the second
    finds the same values there: `created` False)."""

    def __init__(
        self,
        addr: str | Sequence[str],
        *,
        tls: TlsConfig | None = None,
        timeout_s: float = 5.0,
        api_key: str | None = None,
        server_ca: str | None = None,
        declared: tuple[TenantRatePolicy, ...] = (),
        member_id: str = "",
    ) -> None:
        """`timeout_s`: how long one call may take, resends included.

        `tls`: the node's own certificates (mTLS, as to peers); `server_ca` instead: TLS
        that verifies governord's certificate against this CA file, presenting none.

        `declared`: the generations this node has from its own file; each watch sends them,
        so governord refuses a put that would give one of them other values, at the pusher
        (a node that reloads its file sets `declared` again; the next watch carries it)."""
        self.addrs = check_addresses("addr", addr, error=ConfigError)
        self.timeout_s = timeout_s
        self.declared = declared
        self.member_id = member_id
        self._metadata = () if api_key is None else ((API_KEY_MD, api_key),)
        self._tls = tls
        self._server_ca = None if server_ca is None else Path(server_ca).read_bytes()
        self._channels: dict[int, aio.Channel] = {}
        self.follower = LeaderFollower(self.addrs)

    @property
    def addr(self) -> str:
        """The address calls go to now (the leader, as far as this client knows)."""
        return self.follower.leader

    @property
    def switches(self) -> int:
        """Times calls moved to another address (diagnostics, tests)."""
        return self.follower.switches

    def _channel(self, at: int) -> aio.Channel:
        channel = self._channels.get(at)
        if channel is None:
            addr = self.follower.addrs[at]  # with the leaders standbys named
            if self._server_ca is not None:
                creds = grpc.ssl_channel_credentials(root_certificates=self._server_ca)
                options = channel_options(MAX_MESSAGE_BYTES)
                channel = aio.secure_channel(addr, creds, options=options)
            else:
                channel = open_channel(addr, self._tls, MAX_MESSAGE_BYTES)
            self._channels[at] = channel
        return channel

    async def _unary(self, name: str, body: dict[str, Any]) -> Any:
        data = pack(body)
        path = method_path(name)

        async def attempt(at: int, timeout_s: float | None) -> bytes:
            try:
                reply: bytes = await self._channel(at).unary_unary(path)(
                    data, timeout=timeout_s, metadata=self._metadata
                )
            except grpc.RpcError as exc:
                raise status_of(exc) from None
            return reply

        give_up_at = time.monotonic() + self.timeout_s
        try:
            reply = await self.follower.call(
                attempt, give_up_at=give_up_at, timeout_s=self.timeout_s
            )
        except CallFailed as failed:
            raise translate_status(
                failed.code, failed.details, f"coordinator.{name.lower()}"
            ) from failed
        return unpack(reply, name.lower())

    async def put(
        self,
        policy: dict[str, Any] | TenantRatePolicy,
        *,
        expect_generation: int | None = None,
    ) -> PutResult:
        """Store `policy` as the next generation of its key (a mapping may leave out
        `generation`). `expect_generation`: the key's current generation this change was
        computed against (0: none); another writer's change in between refuses the put."""
        body: dict[str, Any] = {
            "policy": policy.to_dict() if isinstance(policy, TenantRatePolicy) else policy
        }
        if expect_generation is not None:
            body["expect_generation"] = expect_generation
        obj = await self._unary("Put", body)
        if not isinstance(obj, dict):
            raise MessageError("put", "must be a mapping")
        stored = TenantRatePolicy.from_dict(obj.get("policy"), where="policy", error=MessageError)
        revision, created = obj.get("revision"), obj.get("created", True)
        if type(revision) is not int or type(created) is not bool:
            raise MessageError("put", "revision and created must be an integer and a bool")
        said = obj.get("disagreements", [])
        if not isinstance(said, (list, tuple)) or not all(isinstance(x, str) for x in said):
            raise MessageError("put.disagreements", "must be a list of strings")
        return PutResult(stored, revision, created, tuple(said[:DISAGREEMENTS_SHOWN_MAX]))

    async def remove(
        self, tenant_id: str, metric: str, *, expect_generation: int | None = None
    ) -> Tombstone:
        """Remove the key's own policy (a tombstone generation); returns the tombstone."""
        body: dict[str, Any] = {"tenant_id": tenant_id, "metric": str(metric)}
        if expect_generation is not None:
            body["expect_generation"] = expect_generation
        obj = await self._unary("Remove", body)
        raw = obj.get("removed") if isinstance(obj, dict) else None
        return Tombstone.from_wire(raw, "removed", MessageError)

    async def list(self) -> PolicySnapshot:
        return PolicySnapshot.from_wire(await self._unary("List", {}), MessageError)

    async def history(self, tenant_id: str, metric: str | None = None) -> tuple[HistoryEntry, ...]:
        """Every kept generation of the tenant's keys (one metric's, if given), oldest first."""
        body: dict[str, Any] = {"tenant_id": tenant_id}
        if metric is not None:
            body["metric"] = str(metric)
        return tuple(HistoryEntry.list_from_wire(await self._unary("History", body), MessageError))

    async def watch(self, after_revision: int) -> AsyncIterator[PolicySnapshot]:
        """Snapshots past `after_revision`. A stream that breaks (PeerUnavailable) reopens on
        the next address (or the leader a standby named) from the last revision yielded; one
        that fails on every address in turn without yielding raises, and the feed polls."""
        failed = 0  # opens in a row that broke without yielding
        while True:
            at = self.follower.current
            try:
                async with contextlib.aclosing(self._watch_one(at, after_revision)) as snaps:
                    async for snap in snaps:
                        failed = 0
                        after_revision = max(after_revision, snap.revision)
                        yield snap
                return  # the coordinator ended the stream: the feed decides what next
            except _WatchBroke as broke:
                failed += 1
                self.follower.moved(at, broke.failed)  # may learn the leader a standby named
                addrs = self.follower.addrs
                if len(addrs) == 1 or failed > len(addrs):
                    raise broke.error from broke.failed

    async def _watch_one(
        self, at: int, after_revision: int
    ) -> AsyncGenerator[PolicySnapshot, None]:
        body: dict[str, Any] = {"after_revision": after_revision}
        if self.declared:
            body["declared"] = [p.to_dict() for p in self.declared]
        if self.member_id:
            body["member_id"] = self.member_id
        call = self._channel(at).unary_stream(method_path("Watch"))(
            pack(body), metadata=self._metadata
        )
        try:
            async for data in call:
                self.follower.answered = at
                yield PolicySnapshot.from_wire(unpack(data, "watch"), MessageError)
        except grpc.RpcError as exc:
            failed = status_of(exc)
            error = translate_status(failed.code, failed.details, "coordinator.watch")
            if isinstance(error, PeerUnavailable):
                raise _WatchBroke(error, failed) from exc
            raise error from exc
        finally:
            call.cancel()

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)


class _WatchBroke(Exception):
    """A watch stream broke (PeerUnavailable): `watch` may reopen it elsewhere."""

    def __init__(self, error: PeerUnavailable, failed: CallFailed) -> None:
        super().__init__(str(error))
        self.error = error
        self.failed = failed

"""The async SDK: a session that heartbeats and fails closed, the current task in a contextvar,
``consume``, ``acquire`` (a context manager that reports latency and overload), ``Group``.

Fail closed: the client gives up its session locally at 80 % of the TTL after the *send* time of
the last heartbeat that succeeded (the server renewed it later than that, so the local deadline
is always earlier than the server's), and cancels the work of every task it governs. Time is
``time.monotonic``, so a wall-clock jump does not move the deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._errors import AuthError, GovernorClientError, SessionLost, Unavailable
from ._rpc import Dial, Rpc

__all__ = [
    "Client",
    "Group",
    "Lease",
    "Task",
    "acquire",
    "consume",
    "current_task",
    "validate",
]

T = TypeVar("T")
LOCAL_DEADLINE_SHARE = 0.8
HEARTBEATS_PER_TTL = 3
CLOSE_GIVE_UP_S = 2.0  # close() tries to end the session on governord this long


@dataclass(slots=True)
class Task:
    """A node of the tree this code runs under; ``client.task(...)`` makes one current."""

    client: Client
    node_id: int
    name: str


@dataclass(slots=True)
class Lease:
    """A held slot. Set ``overloaded = True`` if the downstream said it was overloaded."""

    lease_id: int
    node_id: int
    cls: str
    overloaded: bool = False
    started: float = field(default_factory=time.monotonic)


_CURRENT: contextvars.ContextVar[Task | None] = contextvars.ContextVar(
    "governor_task", default=None
)


def current_task() -> Task:
    task = _CURRENT.get()
    if task is None:
        raise GovernorClientError("no governed task here: use `async with client.task(...)`")
    return task


def _rid() -> str:
    """128 random bits as 32 hex digits (like uuid4().hex, a quarter of the CPU)."""
    return os.urandom(16).hex()


class Client:
    """``async with Client() as client:`` dials with arguments or GOVERNOR_* variables.
    ``addr`` may name several governords ("a:7443,b:7443", or a list): calls follow the
    leader, and the session (its token is in the shared record) carries on across a takeover.

    Short calls share one Multiplex stream (many per message); ``multiplex=False`` gives each
    call a unary call of its own (same answers, same errors, more CPU per call)."""

    def __init__(
        self,
        addr: str | Sequence[str] | None = None,
        api_key: str | None = None,
        *,
        tls: bool | None = None,
        ca_file: str | None = None,
        server_name: str | None = None,
        ttl_ms: int | None = None,
        connect_timeout_s: float = 10.0,
        multiplex: bool = True,
    ) -> None:
        self.dial = Dial.from_env(addr, api_key, tls, ca_file, server_name)
        self._rpc = Rpc(self.dial, multiplex=multiplex)
        self._ttl_ms = ttl_ms
        self._connect_timeout_s = connect_timeout_s
        self.session_id = 0
        self.scope_id = 0
        self.tenant = ""
        self.ttl_s = 0.0
        self.local_deadline = 0.0  # monotonic: the session is given up locally after this
        self.lost: SessionLost | None = None
        self._governed: set[asyncio.Task[Any]] = set()
        self._background: list[asyncio.Task[None]] = []
        self.heartbeats_ok = 0

    # ---- session ---------------------------------------------------------------------------

    async def connect(self) -> Client:
        give_up = time.monotonic() + self._connect_timeout_s
        sent = time.monotonic()
        body = {"ttl_ms": self._ttl_ms} if self._ttl_ms else {}
        reply = await self._rpc.call("OpenSession", body, auth="key", give_up_at=give_up)
        self._rpc.token = reply["token"]
        self.session_id = reply["session_id"]
        self.scope_id = reply["scope_id"]
        self.tenant = reply.get("tenant", "")
        self.ttl_s = reply["ttl_ms"] / 1000
        self.local_deadline = sent + LOCAL_DEADLINE_SHARE * self.ttl_s
        self._background = [
            asyncio.create_task(self._heartbeats(), name="governor-heartbeat"),
            asyncio.create_task(self._watchdog(), name="governor-watchdog"),
        ]
        return self

    def redial(self) -> None:
        """governord is back after it went away (a restart, a takeover): the next attempt
        of every call dials at once instead of after its channel's back-off (`Rpc.redial`).
        The session is unchanged."""
        self._rpc.redial()

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for t in self._background:
            t.cancel()
        for t in self._background:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: S110 - stopping
                pass
        if self.session_id and self.lost is None:
            try:
                # bounded: a governord that stays down must not keep close() waiting
                give_up = time.monotonic() + CLOSE_GIVE_UP_S
                await self._rpc.call("CloseSession", {}, timeout_s=2.0, give_up_at=give_up)
            except GovernorClientError:
                pass
        await self._rpc.close()

    async def _heartbeats(self) -> None:
        period = self.ttl_s / HEARTBEATS_PER_TTL
        while self.lost is None:
            await asyncio.sleep(period)
            sent = time.monotonic()
            try:
                await self._rpc.call(
                    "Heartbeat", {}, give_up_at=self.local_deadline, timeout_s=period
                )
            except (Unavailable, AuthError, SessionLost) as exc:
                if isinstance(exc, Unavailable):
                    continue  # the watchdog decides when to give up
                self._lose(f"governord ended the session: {exc}")
                return
            self.local_deadline = max(self.local_deadline, sent + LOCAL_DEADLINE_SHARE * self.ttl_s)
            self.heartbeats_ok += 1

    async def _watchdog(self) -> None:
        while self.lost is None:
            left = self.local_deadline - time.monotonic()
            if left <= 0:
                self._lose("no successful heartbeat within 80% of the session TTL")
                return
            await asyncio.sleep(left)

    def _lose(self, why: str) -> None:
        if self.lost is not None:
            return
        self.lost = SessionLost(f"session {self.session_id} lost: {why}", "SESSION_LOST")
        for task in list(self._governed):
            task.cancel(msg="governor session lost")

    def _check(self) -> float:
        """Raise if the session is lost; return the monotonic time resends give up at."""
        if self.lost is not None:
            raise self.lost
        return self.local_deadline

    async def call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        """A raw call with this session's token (see docs/governor-api.md)."""
        give_up = self._check()
        try:
            return await self._rpc.call(method, body, give_up_at=give_up)
        except Unavailable:
            if time.monotonic() >= self.local_deadline:
                self._lose("governord unreachable past the local deadline")
                raise self.lost from None  # type: ignore[misc]
            raise

    # ---- explicit-node calls (the sync wrapper uses these) ---------------------------------

    async def create_node(
        self,
        name: str,
        *,
        parent_id: int | None = None,
        quotas: dict[str, int] | None = None,
        limits: dict[str, int] | None = None,
        deadline: float | None = None,
        priority: int | None = None,
        weight: int | None = None,
        ensure: bool = False,
        rates: dict[str, tuple[int, int]] | None = None,
    ) -> int:
        """A child node; ``rates`` maps a resource to (units per second, burst) for credit."""
        body: dict[str, Any] = {"name": name, "request_id": _rid()}
        if parent_id is not None:
            body["parent_id"] = parent_id
        for k, v in (("quotas", quotas), ("limits", limits), ("priority", priority)):
            if v is not None:
                body[k] = v
        if weight is not None:
            body["weight"] = weight
        if deadline is not None:
            body["deadline_ms"] = int(deadline * 1000)
        if rates is not None:
            body["rates"] = {k: [per_s, burst] for k, (per_s, burst) in rates.items()}
        reply = await self.call("EnsureNode" if ensure else "CreateNode", body)
        return int(reply["node_id"])

    async def end_node(self, node_id: int, *, cancel: bool = False) -> None:
        await self.call(
            "CancelNode" if cancel else "CloseNode", {"node_id": node_id, "request_id": _rid()}
        )

    async def get_node(self, node_id: int | None = None) -> dict[str, Any]:
        return await self.call("GetNode", {} if node_id is None else {"node_id": node_id})

    async def consume_at(self, node_id: int, resource: str, amount: int = 1) -> None:
        body = {"node_id": node_id, "resource": resource, "amount": amount, "request_id": _rid()}
        await self.call("Consume", body)

    async def acquire_at(self, node_id: int, cls: str, timeout: float | None = None) -> Lease:
        """One lease of ``cls`` at ``node_id``, waiting in the fair queue (at most ``timeout``
        seconds). A wait cut by a leader change raises LeaderChanged (an Unavailable): the
        caller holds no lease and may retry; it is not queued again behind its back."""
        body: dict[str, Any] = {"node_id": node_id, "cls": cls, "request_id": _rid()}
        if timeout is not None:
            body["timeout_ms"] = int(timeout * 1000)
        reply = await self.call("Acquire", body)
        return Lease(int(reply["lease_id"]), node_id, cls)

    async def release(self, lease: Lease) -> bool:
        latency_ms = int((time.monotonic() - lease.started) * 1000)
        body = {
            "lease_id": lease.lease_id,
            "latency_ms": latency_ms,
            "overloaded": lease.overloaded,
            "request_id": _rid(),
        }
        reply = await self.call("Release", body)
        return bool(reply["released"])

    async def validate(self, lease_id: int) -> bool:
        reply = await self.call("Validate", {"lease_id": lease_id})
        return bool(reply["live"])

    async def set_quota(self, node_id: int, resource: str, limit: int | None) -> None:
        body = {"node_id": node_id, "resource": resource, "limit": limit, "request_id": _rid()}
        await self.call("SetQuota", body)

    async def set_limit(self, node_id: int, cls: str, limit: int | None) -> None:
        body = {"node_id": node_id, "cls": cls, "limit": limit, "request_id": _rid()}
        await self.call("SetLimit", body)

    async def set_cooldown(
        self, node_id: int, name: str, seconds: float, *, replace: bool = False
    ) -> int:
        """Back every caller of `name` under `node_id` off for `seconds` (docs/gov.md);
        returns the cooldown's end, epoch ms."""
        body = {
            "node_id": node_id,
            "name": name,
            "duration_ms": int(seconds * 1000),
            "replace": replace,
            "request_id": _rid(),
        }
        return int((await self.call("SetCooldown", body))["until_ms"])

    async def set_rate(self, node_id: int, resource: str, rate: tuple[int, int] | None) -> None:
        """Set a node's rate for ``resource`` as (units per second, burst); None removes it."""
        per_s, burst = rate if rate is not None else (None, None)
        body = {
            "node_id": node_id,
            "resource": resource,
            "per_s": per_s,
            "burst": burst,
            "request_id": _rid(),
        }
        await self.call("SetRate", body)

    async def reserve_credit(self, node_id: int, resource: str, units: int) -> dict[str, Any]:
        """One credit block (docs/strict.md): ``block_id, units, ttl_ms, ...``. Resends carry
        the same request id, so the block is timed from the first send: the caller records
        the send time *before* awaiting this (``governor.client.StrictCredit`` does)."""
        body = {"node_id": node_id, "resource": resource, "units": units, "request_id": _rid()}
        return await self.call("ReserveCredit", body)

    async def return_credit(self, block_id: int, unused: int) -> bool:
        """Give back a block's unused units; False for a second return or an expired block."""
        body = {"block_id": block_id, "unused": unused, "request_id": _rid()}
        reply = await self.call("ReturnCredit", body)
        return bool(reply["returned"])

    async def watch(self, node_id: int) -> AsyncIterator[dict[str, Any]]:
        async for item in self._rpc.stream("WatchNode", {"node_id": node_id}):
            yield item

    # ---- the governed task -----------------------------------------------------------------

    def _here(self, node_id: int | None) -> int:
        if node_id is not None:
            return node_id
        task = _CURRENT.get()
        if task is not None and task.client is self:
            return task.node_id
        return self.scope_id

    @asynccontextmanager
    async def task(
        self,
        name: str,
        *,
        quotas: dict[str, int] | None = None,
        limits: dict[str, int] | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        priority: int | None = None,
    ) -> AsyncIterator[Task]:
        """A subtask of the current task (or of the tenant): current inside the block, ended
        when it leaves (done, or cancelled on an error). ``deadline`` is epoch seconds;
        ``timeout`` is seconds from now. The block is cancelled if the session is lost."""
        if timeout is not None:
            at = time.time() + timeout
            deadline = at if deadline is None else min(deadline, at)
        node_id = await self.create_node(
            name,
            parent_id=self._here(None),
            quotas=quotas,
            limits=limits,
            deadline=deadline,
            priority=priority,
        )
        task = Task(self, node_id, name)
        token = _CURRENT.set(task)
        me = asyncio.current_task()
        if me is not None:
            self._governed.add(me)
        ok = False
        try:
            if deadline is not None:
                async with asyncio.timeout(max(0.0, deadline - time.time())):
                    yield task
            else:
                yield task
            ok = True
        except asyncio.CancelledError:
            if self.lost is not None and me is not None and me.cancelling():
                me.uncancel()
                raise self.lost from None
            raise
        finally:
            _CURRENT.reset(token)
            if me is not None:
                self._governed.discard(me)
            if self.lost is None:
                try:
                    await asyncio.shield(self.end_node(node_id, cancel=not ok))
                except GovernorClientError:
                    pass

    async def consume(self, resource: str, amount: int = 1, *, node_id: int | None = None) -> None:
        await self.consume_at(self._here(node_id), resource, amount)

    @asynccontextmanager
    async def acquire(
        self, cls: str, *, node_id: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[Lease]:
        """Hold one lease of ``cls`` for the block; released with its latency and overload."""
        lease = await self.acquire_at(self._here(node_id), cls, timeout)
        try:
            yield lease
        finally:
            if self.lost is None:
                await asyncio.shield(self.release(lease))


# ---- module-level helpers: governed code needs no handle -----------------------------------


async def consume(resource: str, amount: int = 1) -> None:
    task = current_task()
    await task.client.consume_at(task.node_id, resource, amount)


def acquire(cls: str, *, timeout: float | None = None) -> Any:
    task = current_task()
    return task.client.acquire(cls, node_id=task.node_id, timeout=timeout)


async def validate(lease_id: int) -> bool:
    return await current_task().client.validate(lease_id)


class Group:
    """Fan-out like ``asyncio.TaskGroup``: each coroutine is a subtask of the current task that
    waits for a lease of ``cls`` before it runs, and releases it when it ends."""

    def __init__(self, cls: str, *, timeout: float | None = None) -> None:
        self.cls = cls
        self.timeout = timeout
        self._tg = asyncio.TaskGroup()

    async def __aenter__(self) -> Group:
        current_task()  # must run inside a governed task
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._tg.__aexit__(*exc)

    def spawn(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        *,
        quotas: dict[str, int] | None = None,
        limits: dict[str, int] | None = None,
    ) -> asyncio.Task[T]:
        parent = current_task()
        client = parent.client

        async def run() -> T:
            async with client.task(name, quotas=quotas, limits=limits):
                async with client.acquire(self.cls, timeout=self.timeout):
                    return await fn()

        return self._tg.create_task(run(), name=name)

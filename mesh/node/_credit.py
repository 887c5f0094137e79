"""Strict limits' credit calls: the `CreditDesk`'s effects carried to governord.

The desk (mesh.core, sans-I/O) decides what to ask and when; this driver only makes the
calls with `governor.client`'s async SDK, one session per node, and answers the desk with
`granted` or `failed`. mesh.node may import governor.client: the "only mesh.peer imports grpc"
contract allows indirect imports, and the SDK is the one place governord's session, resend
and error rules live. A reserve records its send time before it leaves (`Reserve.sent_at_ms`,
set by the holder), so a block's local expiry is timed from before the call.

Failures fail closed: a reserve governord refuses leaves the desk at `no_credit` (backing
off); one that cannot reach governord, or whose session is lost, marks it unreachable, so
once what is held expires every verdict is `governor_unreachable`. A return that fails only
leaves its block counted until it expires: safe, the bucket refills later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from governor.client import (
    AuthError,
    Client,
    Denied,
    GovernorClientError,
    RequestError,
    ScopeError,
)
from mesh.config import StrictConfig
from mesh.core.admission import CreditDesk
from mesh.core.effects import Effect, ReserveCredit, ReturnCredit
from mesh.core.policy import RateKey
from ratemesh.credit import node_burst, node_rate, rate_burst

__all__ = ["CreditDriver"]

log = logging.getLogger("mesh.node.credit")
T = TypeVar("T")
RESERVES_IN_FLIGHT_MAX = 4096  # reserve calls at once (the desk asks one per strict gate)
RETURNS_QUEUED_MAX = 65_536  # returns waiting; past it one is dropped (its block expires)
RETURNS_IN_FLIGHT_MAX = 16  # return calls at once
CONNECT_TIMEOUT_S = 2.0  # opening a session: past this governord counts as unreachable
CLOSE_RETURNS_S = 2.0  # a leaving node's returns wait at most this long
REFUSED_LOG_S = 10.0  # a refused reserve (scope, auth) is logged once per this long
RATE_LOOKUPS_MAX = 4096  # strict keys whose node's burst was read; past it, read again
WATCH_AFTER_S = 0.05  # a reserve unanswered this long: watch for governord
PROBE_EVERY_S = 0.01  # the watch's TCP probe of a governord that went away
PROBE_TIMEOUT_S = 0.2  # one probe
WATCH_MAX_S = 600.0  # a watch gives up after this long (the next failing call starts one)
RESENDS_ON_RETURN_MAX = 16  # times one reserve is sent again on governord's return


async def _probe(addr: str) -> bool:
    """Whether ``addr`` (host:port) accepts a TCP connection now."""
    host, _, port = addr.rpartition(":")
    try:
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), PROBE_TIMEOUT_S
        )
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class CreditDriver:
    def __init__(
        self,
        config: StrictConfig,
        desk: CreditDesk,
        *,
        lock: Any,
        served: Callable[[], None],
    ) -> None:
        self.config = config
        self.desk = desk
        self.lock = lock  # the node's: the desk is shared with try_admit's threads
        self.served = served  # serve queued admits once credit arrived
        self.client: Client | None = None
        self._connecting = asyncio.Lock()
        self._reserving: set[asyncio.Task[None]] = set()
        self._returns: deque[ReturnCredit] = deque()
        self._returns_wake = asyncio.Event()
        self._returner: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_soon = False
        self._busy = 0  # returns in a call now
        self._refused_logged = -REFUSED_LOG_S
        self.granted = 0
        self.refused = 0
        self.unreachable = 0
        self.returned = 0
        self.returns_dropped = 0
        self.returns_failed = 0  # returns governord did not take (their blocks expire)
        self.rate_lookups = 0  # GetNode calls for a strict key's burst (one per key)
        self.revived = 0  # times governord was seen back after it went away
        self.resent_on_revival = 0  # reserves sent again at once when it came back
        self._back = asyncio.Event()  # set (and replaced) each time governord is back
        self._watcher: asyncio.Task[None] | None = None
        self._looked_up: set[RateKey] = set()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._returner = self._loop.create_task(self._return_loop(), name="mesh-credit-returns")
        self.desk.wake = self._wake

    # -- carrying effects -----------------------------------------------------------------

    def _wake(self) -> None:
        """A reserve was queued on the hot path (maybe on an app thread): send it soon."""
        if self._wake_soon or self._loop is None:
            return
        self._wake_soon = True
        self._loop.call_soon_threadsafe(self._pump)

    def _pump(self) -> None:
        self._wake_soon = False
        with self.lock:
            effects = self.desk.take()
        self.carry(effects)

    def carry(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, ReserveCredit):
                if len(self._reserving) >= RESERVES_IN_FLIGHT_MAX or self._loop is None:
                    with self.lock:
                        self.desk.failed(e, unreachable=False)
                    continue
                task = self._loop.create_task(self._reserve(e))
                self._reserving.add(task)
                task.add_done_callback(self._reserving.discard)
            elif isinstance(e, ReturnCredit):
                if len(self._returns) >= RETURNS_QUEUED_MAX:
                    self.returns_dropped += 1
                    continue
                self._returns.append(e)
                self._returns_wake.set()

    # -- calls ----------------------------------------------------------------------------

    async def session(self) -> Client:
        """The session, opened when there is none (the node's dependency probe: a wrong key
        or an unreachable governord is said before a strict request finds it)."""
        return await self._session()

    async def _session(self) -> Client:
        """The node's governord session, opened (again) when there is none or it was lost."""
        async with self._connecting:
            client = self.client
            if client is not None and client.lost is None:
                return client
            self.client = None
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
            cfg = self.config
            client = Client(
                cfg.governord,
                cfg.api_key,
                tls=cfg.ca is not None,
                ca_file=cfg.ca,
                ttl_ms=cfg.session_ttl_ms,
                connect_timeout_s=CONNECT_TIMEOUT_S,
            )
            try:
                await client.connect()
            except BaseException:
                with contextlib.suppress(Exception):
                    await client.close()
                raise
            self.client = client
            return client

    async def _reserve(self, e: ReserveCredit) -> None:
        unreachable: bool | None = None
        burst: int | None = None  # an empty bucket's denial states its B
        reply: dict[str, Any] = {}
        client: Client | None = None
        try:
            client = await self._session()
            node = self.config.node_for(e.rate_key.tenant_id) or client.scope_id
            await self._learn_burst(client, node, e.rate_key)  # once per key: before its blocks
            metric, units = e.rate_key.metric, e.request.units
            reply = await self._watched(lambda: client.reserve_credit(node, metric, units))
        except Denied as exc:
            unreachable = False
            burst = rate_burst(exc.denial)
        except (AuthError, ScopeError, RequestError) as exc:
            # A call cut short because its session was closed for a new one (CANCELLED) was
            # never answered; anything else is the config's mistake (a key, a node's scope).
            unreachable = exc.code == "CANCELLED" or client is not self.client
            if not unreachable:
                self._log_refused(e, exc)
        except GovernorClientError:
            unreachable = True  # Unavailable, SessionLost: governord did not answer
        except asyncio.CancelledError:
            with self.lock:
                self.desk.failed(e, unreachable=True)
            raise
        if unreachable is not None:
            if unreachable:
                self._watch_soon()
            self.unreachable += unreachable
            self.refused += not unreachable
            with self.lock:
                self.desk.failed(e, unreachable=unreachable, burst=burst)
            return
        with self.lock:
            try:
                self.desk.granted(e, reply["block_id"], reply["units"], reply["ttl_ms"])
                self.granted += 1
            except (KeyError, TypeError):
                self.desk.failed(e, unreachable=False)
            effects = self.desk.take()
        self.served()
        self.carry(effects)

    async def _watched(self, send: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """A call (``send()``); if it goes unanswered for WATCH_AFTER_S, governord is
        watched for (`_watch`), and once it is back the call is sent again at once on a
        fresh channel rather than after its resends' back-off (up to 500 ms).

        A reserve keeps its send time (`Reserve.sent_at_ms`), so its block's local expiry
        is timed from the first send: a first call governord did take strands its block
        until it expires, which is safe. A return is applied once per block, however
        often it is sent."""
        assert self._loop is not None
        call = self._loop.create_task(send())
        try:
            for _ in range(RESENDS_ON_RETURN_MAX):
                back = self._back
                done, _pending = await asyncio.wait({call}, timeout=WATCH_AFTER_S)
                if done:
                    break
                self._watch_soon()
                waiter = self._loop.create_task(back.wait())
                both: list[asyncio.Task[Any]] = [call, waiter]
                try:
                    done, _pending = await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if call in done:
                    break
                call.cancel()
                await asyncio.wait({call})  # its end, whatever it was (not raised here)
                self.resent_on_revival += 1
                call = self._loop.create_task(send())
            return await call
        finally:
            if not call.done():
                call.cancel()

    def _watch_soon(self) -> None:
        """Watch for governord (one watcher at a time) while a call finds it away."""
        if self._loop is not None and (self._watcher is None or self._watcher.done()):
            self._watcher = self._loop.create_task(self._watch(), name="mesh-credit-watch")

    async def _watch(self) -> None:
        """Probe governord's addresses (a TCP connect, every PROBE_EVERY_S, for at most
        WATCH_MAX_S) and, when one that refused accepts again (a restarted governord is
        ready: it listens once it has recovered its store), tell everyone at once:
        the session's channels dial afresh, calls waiting on it are sent again, and gates
        waiting out an unreachable reserve ask now. Nothing to watch if none refuses."""
        assert self._loop is not None
        addrs = self.config.governord.split(",")
        refused = {a for a, up in zip(addrs, await self._probe_all(addrs), strict=True) if not up}
        give_up = self._loop.time() + WATCH_MAX_S
        while refused and self._loop.time() < give_up:
            await asyncio.sleep(PROBE_EVERY_S)
            ups = await self._probe_all(sorted(refused))
            if any(ups):
                self._revived()
                return

    def _revived(self) -> None:
        self.revived += 1
        if self.client is not None:
            self.client.redial()
        back, self._back = self._back, asyncio.Event()
        back.set()
        with self.lock:
            self.desk.reachable()
        self._pump()

    @staticmethod
    async def _probe_all(addrs: list[str]) -> list[bool]:
        return list(await asyncio.gather(*(_probe(a) for a in addrs)))

    async def _learn_burst(self, client: Client, node: int, key: RateKey) -> None:
        """Once per strict key, before its first reserve: read its node's rate, so its blocks
        stay a share of the burst B from its second block on (a block of a second of demand
        took a small bucket whole, and then one worker held the whole initial burst). A rate
        on an ancestor is learned from its denials instead (`rate_burst`)."""
        if key in self._looked_up:
            return
        if len(self._looked_up) >= RATE_LOOKUPS_MAX:
            self._looked_up.clear()
        self._looked_up.add(key)
        self.rate_lookups += 1
        try:
            info = await client.get_node(node)
        except GovernorClientError as exc:
            self._looked_up.discard(key)  # read again after the next answer
            log.debug("reading a strict node's rate failed: %r", exc)
            return
        burst = node_burst(info, key.metric)
        if burst is not None:
            with self.lock:
                self.desk.learned_burst(key, burst, node_rate(info, key.metric))

    def _log_refused(self, e: ReserveCredit, exc: GovernorClientError) -> None:
        assert self._loop is not None
        now = self._loop.time()
        if now - self._refused_logged >= REFUSED_LOG_S:
            self._refused_logged = now
            log.warning("governord refused credit for %s: %s", e.rate_key.tenant_id, exc)

    async def _return_loop(self) -> None:
        """Send the queued returns, up to RETURNS_IN_FLIGHT_MAX at once: a spent-out block
        counts against its bucket's B until its return is applied, so returns sent one
        round trip after another fall behind a worker spending small blocks quickly (the
        bucket then stops refilling at ``B - outstanding``)."""
        assert self._loop is not None
        slots = asyncio.Semaphore(RETURNS_IN_FLIGHT_MAX)
        sending: set[asyncio.Task[None]] = set()
        while True:
            while not self._returns:
                self._returns_wake.clear()
                await self._returns_wake.wait()
            await slots.acquire()
            if not self._returns:
                slots.release()
                continue
            self._busy += 1
            task = self._loop.create_task(self._give_back(self._returns.popleft()))
            sending.add(task)

            def done(t: asyncio.Task[None]) -> None:
                sending.discard(t)
                self._busy -= 1
                slots.release()

            task.add_done_callback(done)

    async def _give_back(self, e: ReturnCredit) -> None:
        try:
            client = await self._session()
            await self._watched(lambda: client.return_credit(e.block_id, e.unused))
            self.returned += 1
        except GovernorClientError as exc:
            # the block stays counted until it expires: safe, only slower to refill
            self.returns_failed += 1
            log.debug("a credit return failed: %r", exc)

    # -- leaving --------------------------------------------------------------------------

    async def close(self) -> None:
        """Leaving: stop asking, let the reserves in flight finish (a block granted now goes
        back whole), give back everything held, end the session; each wait bounded."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_RETURNS_S
        with self.lock:
            self.desk.closing = True
        if self._reserving:
            await asyncio.wait(list(self._reserving), timeout=CLOSE_RETURNS_S)
        for task in list(self._reserving):
            task.cancel()  # its block, if governord granted it, is counted until it expires
        await asyncio.gather(*self._reserving, return_exceptions=True)
        with self.lock:
            effects = self.desk.leave()
        self.carry(effects)
        while (self._returns or self._busy) and loop.time() < deadline:
            await asyncio.sleep(0.005)
        if self._returns:
            log.warning("credit returns on leaving timed out; their blocks expire instead")
        if self._watcher is not None:
            self._watcher.cancel()
        if self._returner is not None:
            self._returner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._returner
        if self.client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.close(), CLOSE_RETURNS_S)
            self.client = None

    def stats(self) -> dict[str, int]:
        d = self.desk
        return {
            "admitted": d.admitted,
            "vetoed": d.vetoed,
            "credit_denied": d.credit_denied,
            "reserves": d.reserves,
            "granted": self.granted,
            "refused": self.refused,
            "unreachable": self.unreachable,
            "returned": self.returned,
            "returns_dropped": self.returns_dropped,
            "returns_failed": self.returns_failed,
            "rate_lookups": self.rate_lookups,
            "revived": self.revived,
            "resent_on_revival": self.resent_on_revival,
        }

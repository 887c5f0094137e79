"""The asyncio driver of one Member: `mesh.testing.fleet.MemoryFleet`'s loop on real time.

It feeds the sans-I/O Member time (a tick every sync interval, an early flush when the
report threshold is crossed), messages (from the transport) and rings (from membership),
and carries out the effects it returns. In a threaded app `lock` guards the Member, since
`try_admit` runs on the app's threads while this loop runs on its own.

`NodeDriver` composes the parts, each in its own module: `Ingest` (peers' messages in, in
slices), `PolicyFetches` (the owner's unknown keys, from the coordinator), `CellTierWriter`
(spend quotas' cells to the shared tier), `RefusedCollector` (memory refused streams leave)
and `DelayTimer` (report and snapshot delays). It keeps the node's life (start, graceful
leave), its clock (tick, flush, forgetting idle keys), membership, and the effects' routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from mesh.config import Identity, NodeConfig
from mesh.coordinator import PolicyFeed
from mesh.core.admission import Counter
from mesh.core.effects import Effect, FetchPolicy, ReserveCredit, ReturnCredit, Send
from mesh.core.member import Member
from mesh.core.messages import CellPublish, Handover, Message, ReportBatch
from mesh.core.quota import CellTier
from mesh.core.ring import Ring
from mesh.membership import MembershipSource, MembershipView
from mesh.node._credit import CreditDriver
from mesh.node._delays import DelayTimer
from mesh.node._fetch import PolicyFetches
from mesh.node._hygiene import RefusedCollector, trim_heap
from mesh.node._ingest import Ingest
from mesh.node._reload import PolicyReloader
from mesh.node._tier import CellTierWriter
from mesh.node._units import AdmittedUnits
from mesh.peer import Transport
from mesh.telemetry import DECISIONS_IDLE_S, Telemetry

if TYPE_CHECKING:
    from mesh.node._watch import DependencyWatch

__all__ = ["NodeDriver"]

log = logging.getLogger("mesh.node")
CLOSE_STEP_S = 2.0  # the longest one step of a graceful leave may take past its drain
# Per-key and per-tenant maps of the node (delay timing, telemetry's decision counts) drop
# what was untouched for this long, once per this long: an idle tenant is gone within 2x.
FORGET_IDLE_NS = int(DECISIONS_IDLE_S * 1_000_000_000)
TRIM_AFTER = 10_000  # a forget pass that dropped this many tenants gives the heap back too
# Hand-over messages queued at once on a graceful leave (`_hand_over`): half a link's queue
# (mesh.peer's LINK_QUEUE_MAX, 1024), so reports queued beside them still fit.
HANDOVER_ROUND = 512
T = TypeVar("T")


class _Via(Generic[T]):
    """An attribute of the node that lives on one of its parts (`NodeDriver.ingest`, ...):
    read, and written, there under the same name."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, node: Any, cls: type | None = None) -> T:
        return getattr(getattr(node, self.part), self.name)  # type: ignore[no-any-return]

    def __set__(self, node: Any, value: T) -> None:
        setattr(getattr(node, self.part), self.name, value)


class NodeDriver:
    """One node's loop around its Member: the parts (`ingest`, `fetches`, `tier`,
    `collector`, `delays`) and what joins them (life, clock, membership, effects)."""

    # The parts' figures, read (by /health, telemetry and tests) as the node's own.
    reports_sliced = _Via[int]("ingest")
    reports_shed = _Via[int]("ingest")
    reports_deduplicated = _Via[int]("ingest")
    rows_deduplicated = _Via[int]("ingest")
    deliver_hold_max_ns = _Via[int]("ingest")
    fetch_polls = _Via[int]("fetches")
    cell_tier = _Via[CellTier | None]("tier")  # set by the node before it serves
    tier_errors = _Via[int]("tier")
    tier_folds = _Via[int]("tier")
    refused_collections = _Via[int]("collector")
    refused_full_collections = _Via[int]("collector")
    recent_delays_ns = _Via[deque[int]]("delays")

    def __init__(
        self,
        config: NodeConfig,
        identity: Identity,
        member: Member,
        transport: Transport,
        membership: MembershipSource,
        feed: PolicyFeed | None,
        telemetry: Telemetry,
        *,
        lock: threading.Lock | None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        reloader: PolicyReloader | None = None,
        credit: CreditDriver | None = None,
        redis: Counter | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.member = member
        self.transport = transport
        self.membership = membership
        self.feed = feed
        self.telemetry = telemetry
        self.reloader = reloader  # the local policy file's reloads (None: no policies.file)
        self.credit = credit  # strict limits' calls to governord (None: no `strict:` section)
        self.redis = redis  # redis limits' shared counter (None: no shared_state.redis)
        self.lock = lock or contextlib.nullcontext()
        self.threaded = lock is not None
        self.clock_ns = clock_ns
        self.loop: asyncio.AbstractEventLoop | None = None
        self.membership_view = MembershipView({identity.member_id: ""}, 0, False)
        self.messages_sent = 0
        self.ticks = 0
        self.tick_lag_max_s = 0.0  # the longest the sync tick ran late (loop or CPU busy)
        self.started_ns = clock_ns()
        self.closing = False
        self.handed_over = False  # graceful leave: our keys went to their next owners
        self.watch: DependencyWatch | None = None  # its dependencies' probes (Mesh sets it)
        # Graceful leave: keys held, and those not confirmed on the wire within the drain
        # (their next owners start them exhausted, refilling at R: the safe side).
        self.handover_keys = 0
        self.handover_keys_late = 0
        self._flush_soon = False
        self._tasks: list[asyncio.Task[Any]] = []
        self._forget_at_ns = self.started_ns + FORGET_IDLE_NS
        telemetry.top_k = config.telemetry_top_k
        self.member.reporter.wake = self._wake
        self.delays = DelayTimer(telemetry)
        self.ingest = Ingest(member, self.lock, clock_ns, self._carry, self.delays.observe)
        self.fetches = PolicyFetches(member, self.lock, feed, clock_ns)
        self.tier = CellTierWriter(member, self.lock, self._spawn)
        self.collector = RefusedCollector(transport, clock_ns)
        # Units admitted per limit, counted as reports go out and views settle, never on
        # the hot path (`ratemesh_admitted_units_total`, mesh/node/_units.py)
        self.units = AdmittedUnits()

    @property
    def member_id(self) -> str:
        return self.member.member_id

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = self.ingest.loop = asyncio.get_running_loop()
        if self.credit is not None:
            self.credit.start()
        self._spawn(self._ticker(), "mesh-tick")
        self._spawn(self._run_membership(), "mesh-membership")
        self._spawn(self.collector.run(), "mesh-refused-gc")
        if self.reloader is not None and self.reloader.watch_ms > 0:
            self._spawn(self.reloader.watch(), "mesh-policy-file")
        if self.feed is not None:
            await self.feed.poll()  # best effort: start with the coordinator's policies
            self._spawn(self.feed.run(), "mesh-policy-feed")
            self._spawn(self.fetches.run(self.feed), "mesh-policy-fetch")

    def _spawn(self, coro: Any, name: str) -> None:
        assert self.loop is not None
        task = self.loop.create_task(coro, name=name)
        task.add_done_callback(_report_crash)
        self._tasks.append(task)

    async def close(self) -> None:
        """Graceful leave: hand our keys to their next owners, leave the ring, flush and
        wait (bounded) for acknowledgements, stop accepting peers, then cancel the rest."""
        if self.closing:
            return
        self.closing = self.fetches.closing = self.tier.closing = True
        drain_s = self.config.shutdown_drain_ms / 1000
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_s
        await self._hand_over(drain_s / 2)
        try:
            await asyncio.wait_for(self.membership.leave(), max(drain_s, 0.1))
        except TimeoutError:
            log.warning("leaving membership timed out; the lease will lapse instead")
        if self.credit is not None:  # give back what strict limits hold, then end the session
            await _bounded(self.credit.close(), CLOSE_STEP_S * 2, "strict credit")
        self._flush()
        while self._unacked() and loop.time() < deadline:
            await asyncio.sleep(self.config.core.sync_interval_ms / 1000)
        for t in self._tasks:
            t.cancel()
        # Each step is bounded: a stop that hangs on a peer or a membership server that
        # went away would keep the process from ever exiting.
        await _bounded(
            asyncio.gather(*self._tasks, return_exceptions=True), CLOSE_STEP_S, "node tasks"
        )  # their crashes were logged
        self._tasks.clear()
        self.fetches.release(None)  # the fetcher is gone: nothing stays asked for
        await _bounded(self.membership.close(), CLOSE_STEP_S, "membership source")
        if self.feed is not None:
            await _bounded(self.feed.source.close(), CLOSE_STEP_S, "policy source")
        rest_s = max(0.0, deadline - loop.time())
        await _bounded(self.transport.close(rest_s), rest_s + CLOSE_STEP_S, "peer transport")

    async def _hand_over(self, timeout_s: float) -> None:
        """Before leaving the ring: apply our own keys' pending reports, send every held
        key's state to its next owner, and wait (bounded) until it is written,
        so the new owners have it before the ring change sends them the keys' reports."""
        self._flush()
        await asyncio.sleep(0)  # reports to ourselves are delivered by the loop: apply them
        self.ingest.drain()  # and what waits for its slices, so that it is handed over too
        now = self.clock_ns()
        with self.lock:
            effects = self.member.leave(now)
        self.handed_over = True
        # In rounds of HANDOVER_ROUND messages, each written before the next is queued: a
        # hand-over of many keys is many messages (HANDOVER_ROWS_MAX rows each), more than
        # a link's queue holds at once (LINK_QUEUE_MAX; what finds it full is dropped). A
        # round not on the wire by `timeout_s` ends it: what is left is not queued to be
        # dropped, only counted and said (`handover_keys_late`).
        assert self.loop is not None
        until = self.loop.time() + timeout_s
        self.handover_keys = _keys_in(effects)
        for i in range(0, len(effects), HANDOVER_ROUND):
            batch = effects[i : i + HANDOVER_ROUND]
            self._carry(now, batch)
            if not await self.transport.flush(max(0.0, until - self.loop.time())):
                self.handover_keys_late = _keys_in(effects[i:])
                log.warning(
                    "hand-over: %d of %d keys not on the wire within %.0f ms (half of "
                    "shutdown_drain_ms; their next owner stopped too, or is unreachable); "
                    "their next owners start them exhausted, which admits less, never more",
                    self.handover_keys_late,
                    self.handover_keys,
                    timeout_s * 1000,
                )
                break

    def _unacked(self) -> bool:
        with self.lock:
            return any(v.inflight for v in self.member.reporter.gates.values())

    # -- time -----------------------------------------------------------------------------

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        interval_s = self.config.core.sync_interval_ms / 1000
        next_t = loop.time()
        while True:
            now = self.clock_ns()
            with self.lock:
                self.units.settling(self.member.admission)
                effects = self.member.tick(now)
            self.ticks += 1
            self._carry(now, effects)
            self.fetches.release(now)
            if now >= self._forget_at_ns:
                self.forget_idle(now)
            next_t += interval_s
            delay = next_t - loop.time()
            if -delay > self.tick_lag_max_s:
                self.tick_lag_max_s = -delay  # the loop (or the CPU) was this far behind
            self.delays.recent_tick_lags_ns.append(int(-delay * 1e9) if delay < 0 else 0)
            if delay < 0:
                next_t = loop.time()
                delay = 0
            await asyncio.sleep(delay)

    def _wake(self) -> None:
        """The reporter's threshold was crossed (on the hot path, maybe another thread)."""
        if self._flush_soon or self.loop is None:
            return
        self._flush_soon = True
        if self.threaded:
            self.loop.call_soon_threadsafe(self._flush)
        else:
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        now = self.clock_ns()
        with self.lock:
            effects = self.member.flush(now)
        self._carry(now, effects)

    def forget_idle(self, now: int) -> None:
        """Drop what idle keys and tenants left in the node's own maps: decision counts
        unchanged since the last call (kept as per-series totals), delay timings older than
        FORGET_IDLE_NS. The core forgets its idle keys itself (views, reporter, owner), but
        the ring's memoised lookups (up to 65,536 keys, each pinning its tenant's name) are
        refilled by whichever side looks a key up after the core compacted: dropped here too,
        so that active keys are looked up again once a period and idle ones are let go."""
        self._forget_at_ns = now + FORGET_IDLE_NS
        with self.lock:
            self.member.ring.forget_lookups()
            self.units.forget_idle()
        dropped = self.telemetry.forget_idle()
        self.delays.forget_idle(now - FORGET_IDLE_NS)
        if dropped >= TRIM_AFTER:
            trim_heap()

    # -- messages -------------------------------------------------------------------------

    def link_reset(self, peer: str) -> None:
        """Our stream to `peer` reopened: resend what it may have lost, at the next tick."""
        with self.lock:
            self.member.reporter.link_reset(peer)

    def deliver(self, message: Message) -> None:
        """A validated message from a peer (the transport's callback): `Ingest.deliver`."""
        self.ingest.deliver(message)

    def busy(self, sender: str) -> bool:
        """Whether `sender`'s reports wait for their slices (`Ingest.busy`)."""
        return self.ingest.busy(sender)

    def report_429(self, tenant: str, metric: str, ms: int) -> None:
        """On the node's loop: the 429 cooldown of (`tenant`, `metric`), here and through its
        owner on every worker that uses the limit (docs/cooldown.md)."""
        now = self.clock_ns()
        with self.lock:
            effects = self.member.report_429(now, tenant, metric, ms)
        self._carry(now, effects)

    def clear_429(self, tenant: str, metric: str) -> bool:
        """On the node's loop: end (`tenant`, `metric`)'s cooldown here (docs/cooldown.md)."""
        with self.lock:
            return self.member.clear_429(tenant, metric)

    def _carry(self, now: int, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Send):
                if isinstance(e.message, ReportBatch):  # ours, going out: count new usage
                    self.units.reported(self.member.reporter.gates, e.message)
                if e.to == self.member_id:  # our own keys: a local call, not a message
                    # Applied whole, not in slices: our own reports come from our own flush
                    # (as long a hold as the flush was), and held in a backlog behind
                    # slices they went unacknowledged past report_retry_ms, were resent,
                    # and their resends filled the backlog (`mesh bench churn`).
                    assert self.loop is not None
                    self.loop.call_soon(self.ingest.apply, e.message)
                    if isinstance(e.message, CellPublish):
                        self.tier.publish(e.message)
                    continue
                if isinstance(e.message, ReportBatch):
                    self.delays.sent(now, e.message)
                elif isinstance(e.message, CellPublish):
                    self.tier.publish(e.message)
                self.messages_sent += 1
                self.transport.send(e.to, e.message)
            elif isinstance(e, FetchPolicy):
                self.fetches.want(now, e.rate_key)
            elif isinstance(e, (ReserveCredit, ReturnCredit)) and self.credit is not None:
                self.credit.carry([e])

    # -- membership -----------------------------------------------------------------------

    async def _run_membership(self) -> None:
        await self.membership.run(self.on_membership)

    def on_membership(self, view: MembershipView) -> None:
        """Adopt the source's view: a new ring if the members or epoch changed, else only
        the stale flag (share limits decay to N=1 while stale, and say so)."""
        if self.closing and (not view.members or self.handed_over):
            return  # we route by the ring without us until we stop
        members = dict(view.members) or {self.member_id: ""}
        now = self.clock_ns()
        ring = self.member.ring
        self.membership_view = view
        with self.lock:
            if set(members) == set(ring.members) and view.epoch <= ring.epoch:
                self.member.admission.membership(len(ring), view.stale, now)
                return
            epoch = view.epoch if view.epoch > ring.epoch else ring.epoch + 1
            new = Ring(members, epoch, vnodes=ring.vnodes)
            self.member.ring_changed(now, new, stale=view.stale)
        self.transport.set_peers({m: a for m, a in members.items() if m != self.member_id})
        log.info(
            "ring epoch %d: %s%s", epoch, ",".join(new.members), " (stale)" if view.stale else ""
        )


def _keys_in(effects: list[Effect]) -> int:
    """The keys a graceful leave's hand-over messages carry."""
    return sum(
        len(e.message.keys)
        for e in effects
        if isinstance(e, Send) and isinstance(e.message, Handover)
    )


def _report_crash(task: asyncio.Task[Any]) -> None:
    """A node task ended other than by cancellation: that is a bug; say so loudly."""
    if not task.cancelled() and task.exception() is not None:
        log.error("node task %s crashed", task.get_name(), exc_info=task.exception())


async def _bounded(step: Awaitable[Any], timeout_s: float, what: str) -> None:
    """Await one step of closing for at most `timeout_s`; past that, say so and go on."""
    try:
        await asyncio.wait_for(step, timeout_s)
    except TimeoutError:
        log.warning("closing: %s did not stop within %.1f s; going on without it", what, timeout_s)

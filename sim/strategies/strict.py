"""`strict`: governord's credit blocks, the real code on both sides, on the virtual clock.

One ``governor.engine.Engine`` (a rated node per tenant under the root, one session per
worker) and one ``ratemesh.credit.CreditHolder`` per (worker, tenant). ``ReserveCredit`` and
``ReturnCredit`` and their replies cross the scenario's network as messages (latency, jitter,
loss, duplication). The hot path is credit only: no mesh check in front, since the mesh's
veto changes no bound here and composing the two would measure the mesh twice. An arrival its
holder cannot pay for waits, as the node's ``admit(..., timeout_s=)`` waits in the tenant's
queue: a reserve goes out, the queue is served when the block arrives, and what is left at
the deadline is denied (``admit`` answers None, then ``Strategy.resolved``).

The durable log is in memory: the engine's sink appends each event before the call returns
(so before the reply leaves, as governord commits before answering), and every
``SNAPSHOT_EVERY_EVENTS`` events a snapshot replaces the log. A ``governor_crash`` fault drops
the engine; requests reaching it then get no reply. On restart ``Engine.restore(snapshot,
log)`` rebuilds it, and the rebuilt state is checked against the state at the crash, so a
crash loses nothing acknowledged and blocks already granted stay counted until they expire.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

from governor.engine import (
    ROOT_ID,
    Created,
    CreditGrant,
    Denial,
    DenyReason,
    Engine,
    EngineConfig,
    Event,
    Rate,
)
from mesh.core.config import MS, CoreConfig
from ratemesh.credit import GOVERNOR_UNREACHABLE, CreditConfig, Reserve, local_expiry_ms
from ratemesh.creditloop import CreditLoop
from ratemesh.envelope import percentiles
from sim.scenario import Policy
from sim.strategies.base import Context, Strategy
from sim.workload import Arrival

__all__ = ["StrictStrategy", "GOVERNORD", "CREDIT_TTL_MS", "local_life_ms"]

GOVERNORD = "governord"
CREDIT_TTL_MS = 2_000  # short, so an outage shows the fail-closed edge within a short run
SESSION_TTL_MS = 86_400_000  # workers' sessions outlive any run (heartbeats not simulated)
SNAPSHOT_EVERY_EVENTS = 5_000
# ... or, with a large tree, once the log has this many events per node and session: a store
# compacts when its log outgrows the snapshot, and at `scale` (10,000 nodes) a snapshot every
# 5,000 events took a quarter of the run
SNAPSHOT_EVENTS_PER_RECORD = 8
RESEND_MS = 100  # an unanswered reserve is resent, same request id, this often, until
# the holder's unreachable_after_ms; then a new request (new id, new send time) replaces it
JOINERS_MAX = 64  # as sim.scenario: a join fault may name up to this many new ids
SWEEP_MS = 250  # idle holders give back their credit on this tick, not only on demand
# How long an arrival with no credit waits for a block: the node's `admit(..., timeout_s=)` has
# no default, so this is the wait its docs show (`admit_blocking(..., timeout_s=0.5)`).
ADMIT_TIMEOUT_MS = 500
TENANT_QUEUE_MAX = CoreConfig().tenant_queue_max  # waiters per tenant, as the node's queues
# The node's desk looks at refills ahead of need at every tick (`CreditDesk.tick`, each sync
# interval); the sim looks when a holder is used, at most once a tick.
REFILL_TICK_MS = CoreConfig().sync_interval_ms
DEADLINE_EXCEEDED = "deadline_exceeded"
QUEUE_FULL = "queue_full"
WORKER_GONE = "worker_gone"  # a waiter's worker crashed or left
ENGINE_CONFIG = EngineConfig(
    credit_ttl_ms=CREDIT_TTL_MS,
    credit_blocks_per_session_max=1 << 20,  # one session carries every tenant of a worker
    credit_blocks_max=1 << 22,
)
# blocks of about 100 ms of a worker's demand: a block counts whole against B until it is
# spent out and returned, so blocks near B in size would pin the bucket (docs/strict.md)
HOLDER_CONFIG = CreditConfig(block_max=10**9, horizon_ms=100, lead_ms=50)


def local_life_ms(config: CreditConfig = HOLDER_CONFIG, ttl_ms: int = CREDIT_TTL_MS) -> int:
    """The longest a block is spent after its reserve was sent (the holder's own formula)."""
    return local_expiry_ms(0, ttl_ms, config.rho_ppm, config.epsilon_ms)


class _Clock:
    def __init__(self) -> None:
        self.ms = 0

    def now_ms(self) -> int:
        return self.ms


class _Driver:
    """One worker's holder for one tenant and its `CreditLoop` (when to ask, the back-off),
    driven as the node's desk drives a strict gate, and the arrivals waiting on it, as the
    node's tenant queue holds them. The reserve in flight is the holder's ``in_flight``."""

    __slots__ = (
        "worker",
        "tenant",
        "loop",
        "holder",
        "rid",
        "wanted_ms",
        "waiters",
        "retry_armed",
        "refill_at_ms",
    )

    def __init__(self, worker: str, tenant: str) -> None:
        self.worker = worker
        self.tenant = tenant
        self.loop = CreditLoop(HOLDER_CONFIG)
        self.holder = self.loop.holder
        self.rid = ""  # the request id of the reserve in flight (its resends reuse it)
        self.wanted_ms = 0  # the last admission asked of it
        # arrivals waiting for credit, oldest first, with their deadlines (all waits are
        # ADMIT_TIMEOUT_MS, so the head's deadline is the earliest)
        self.waiters: deque[tuple[Arrival, int, int]] = deque()  # (arrival, since, deadline)
        self.retry_armed = False  # a timer will ask again for the waiters (after a back-off)
        self.refill_at_ms = 0  # the next tick at which a refill ahead is looked at


class StrictStrategy(Strategy):
    name = "strict"
    judged_over_intervals = True

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.clock = _Clock()
        self.log: list[Event] = []
        self.snap: dict[str, Any] | None = None
        self.engine: Engine | None = Engine(self.clock, self.log.append, ENGINE_CONFIG)
        self.crashed_state: dict[str, Any] | None = None
        self.crashed_at_ms = 0
        self.restarts = 0
        self.queue: list[tuple[int, int, Callable[[int], None]]] = []
        self.order = itertools.count()
        self.nodes: dict[str, int] = {}
        self.resources: dict[str, str] = {}  # tenant -> the rated resource (its first metric)
        self.bursts: dict[str, int] = {}  # tenant -> its rate's B, as GetNode shows it
        self.sessions: dict[str, int] = {}
        self.drivers: dict[tuple[str, str], _Driver] = {}
        self.rids = itertools.count(1)
        # ReserveCredit and ReturnCredit sent, resends included. `round_trips`: one per
        # request that waited for a block (its hot path waited on governord); `wait_sends`:
        # the reserves those requests waited on, each counted once per request waiting on it
        # when it was sent (the one in flight when a request came included, resends too)
        self.calls = 0
        self.admitted = 0  # units, for governor calls per admitted unit
        self.denials: dict[str, int] = {}  # reason -> requests denied (deadline_exceeded, ...)
        # (deadline_ns, driver) per waiter, in the order they were queued: every wait has the
        # same length, so deadlines come in order and one FIFO stands in for a timer each
        self.deadlines: deque[tuple[int, _Driver]] = deque()
        self.waits_ms: list[int] = []  # how long each waiter that was admitted waited
        self.waited = 0  # requests that waited
        self.wait_sends = 0
        self.pending_rates: list[tuple[str, Policy]] = []  # SetRate while governord is down
        self._setup(ctx)
        records = len(self.nodes) + len(self.sessions)
        self.snapshot_every = max(SNAPSHOT_EVERY_EVENTS, SNAPSHOT_EVENTS_PER_RECORD * records)
        self._at(0, self._sweep)

    # ---- governord -------------------------------------------------------------------------

    def _setup(self, ctx: Context) -> None:
        eng = self.engine
        assert eng is not None
        for tenant in sorted(ctx.tenants):
            p = ctx.tenants[tenant].policy
            got = eng.create_node(None, ROOT_ID, tenant, rates={p.metric: Rate(p.rate, p.burst)})
            assert isinstance(got, Created), got
            self.nodes[tenant] = got.node_id
            self.resources[tenant] = p.metric
            self.bursts[tenant] = p.burst
        joiners = [f"w{j:04d}" for j in range(len(ctx.workers), len(ctx.workers) + JOINERS_MAX)]
        for i, w in enumerate(ctx.workers + joiners):
            token = hashlib.sha256(f"{w}/{i}".encode()).hexdigest()
            self.sessions[w], _ = eng.open_session(ROOT_ID, SESSION_TTL_MS, token)

    def _durable(self) -> None:
        """Compact the in-memory log into a snapshot now and then (the store's job)."""
        if self.engine is not None and len(self.log) >= self.snapshot_every:
            self.snap = self.engine.snapshot()
            self.log.clear()

    def governor_crash(self, now_ns: int) -> None:
        if self.engine is not None:
            self.crashed_at_ms = self.clock.ms
            self.crashed_state = _comparable(self.engine.snapshot())
            self.engine = None

    def governor_restart(self, now_ns: int) -> None:
        if self.engine is None:
            self._restore(now_ns // MS)

    def _restore(self, now_ms: int) -> None:
        """Snapshot + log, rebuilt as at the crash (replay equals live, checked), then on."""
        self.clock.ms = self.crashed_at_ms
        self.engine = Engine.restore(
            self.snap, list(self.log), self.clock, self.log.append, ENGINE_CONFIG
        )
        assert _comparable(self.engine.snapshot()) == self.crashed_state, "replay != live"
        self.clock.ms = max(self.clock.ms, now_ms)
        self.restarts += 1
        for tenant, p in self.pending_rates:
            self.policy_changed(tenant, p, now_ms * MS)
        self.pending_rates.clear()

    # ---- the virtual clock -----------------------------------------------------------------

    def _at(self, t_ns: int, fn: Callable[[int], None]) -> None:
        heapq.heappush(self.queue, (t_ns, next(self.order), fn))

    def advance(self, t_ns: int) -> None:
        queue, deadlines = self.queue, self.deadlines
        while True:
            due = queue[0][0] if queue else t_ns + 1
            if deadlines and deadlines[0][0] <= t_ns and deadlines[0][0] <= due:
                when, d = deadlines.popleft()
                self.clock.ms = max(self.clock.ms, when // MS)
                self._expire(d, when)
            elif due <= t_ns:
                when, _, fn = heapq.heappop(queue)
                self.clock.ms = max(self.clock.ms, when // MS)
                fn(when)
            else:
                break
        self._durable()

    def _sweep(self, t_ns: int) -> None:
        """Idle returns, and the owner that shrinks `drivers`: a holder idle for `idle_ms`
        with nothing held or asked is dropped (its demand history is stale by then)."""
        now_ms = t_ns // MS
        idle_ms = HOLDER_CONFIG.idle_ms
        for key in sorted(self.drivers):
            d = self.drivers[key]
            self._maintain(key[0], key[1], d, now_ms)
            if (
                not d.holder.blocks
                and d.holder.in_flight is None
                and not d.waiters
                and now_ms - d.wanted_ms >= idle_ms
            ):
                del self.drivers[key]
        self._at(t_ns + SWEEP_MS * MS, self._sweep)

    def _send(self, src: str, dst: str, now_ns: int, fn: Callable[[int], None]) -> None:
        """A message; a worker acts on one at its next whole millisecond.

        governord's engine and the holders count whole milliseconds, and the runner's
        arrivals and deadlines fall on them. A reply acted on between two, at its nanosecond,
        would let the checker (which times admissions in nanoseconds) see the engine's
        rounding: a refill counted from the start of governord's millisecond, up to R x 1 ms
        past R*T + B (0.007 units in a trial scale run; docs/strict.md)."""
        self.messages += 1
        for delay in self.ctx.network.transit(src, dst, now_ns):
            at = now_ns + delay
            self._at(at if dst == GOVERNORD else -(-at // MS) * MS, fn)

    # ---- the worker ------------------------------------------------------------------------

    def admit(self, a: Arrival, now_ns: int) -> bool | None:
        """As the node's `admit(..., timeout_s=ADMIT_TIMEOUT_MS)`: spend from what is held,
        else wait in the tenant's queue for a block, denied at the deadline."""
        key = (a.worker, a.tenant)
        d = self.drivers.get(key)
        if d is None:
            d = self.drivers[key] = _Driver(a.worker, a.tenant)
            # the node's driver reads the key's node rate once before its first reserve
            # (`GetNode`): its blocks stay within a share of B (`CreditHolder.block_size`)
            d.holder.learn_burst(self.bursts[a.tenant])
            self.calls += 1
        now_ms = d.wanted_ms = now_ns // MS
        verdict = d.holder.try_spend(now_ms, a.amount)
        if verdict.admitted:
            self.admitted += a.amount
            self._maintain(a.worker, a.tenant, d, now_ms)
            return True
        if ADMIT_TIMEOUT_MS <= 0:
            self._maintain(a.worker, a.tenant, d, now_ms)
            self._deny(verdict.reason or DEADLINE_EXCEEDED)
            return False
        if len(d.waiters) >= TENANT_QUEUE_MAX:
            self._maintain(a.worker, a.tenant, d, now_ms)
            self._deny(QUEUE_FULL)
            return False
        deadline_ns = now_ns + ADMIT_TIMEOUT_MS * MS
        d.waiters.append((a, now_ns, deadline_ns))
        self.deadlines.append((deadline_ns, d))
        self.waited += 1
        self.round_trips += 1
        self.wait_sends += d.holder.in_flight is not None  # it waits on the reserve in flight
        self._ask(d, now_ms, a.amount)
        self._maintain(a.worker, a.tenant, d, now_ms)
        return None

    def _deny(self, reason: str) -> None:
        self.denials[reason] = self.denials.get(reason, 0) + 1  # a few fixed reasons

    def _ask(self, d: _Driver, now_ms: int, amount: int) -> None:
        """Credit denied a waiter: reserve at once, sized for at least `amount`, unless one is
        in flight or governord said no a moment ago (then a timer asks after the back-off),
        as the node's desk does (`CreditLoop.short`)."""
        if d.holder.in_flight is not None:
            return
        retry_at_ms = d.loop.retry_at_ms
        if now_ms < retry_at_ms:
            if not d.retry_armed:
                d.retry_armed = True
                self._at(retry_at_ms * MS, lambda t: self._retry(d, t))
            return
        request = d.loop.short(now_ms, amount)
        if request is not None:
            d.rid = f"{d.worker}/{next(self.rids)}"
            self._reserve(d.worker, d.tenant, d, request, d.rid, now_ms * MS)

    def _retry(self, d: _Driver, t_ns: int) -> None:
        d.retry_armed = False
        if d.waiters and self.drivers.get((d.worker, d.tenant)) is d:
            self._serve(d, t_ns)

    def _serve(self, d: _Driver, t_ns: int) -> None:
        """Admit the waiters that fit now, oldest first, and ask for the rest (the node's
        `Admission.service` after a grant, and at its ticks)."""
        now_ms = t_ns // MS
        waiters = d.waiters
        while waiters:
            a, since_ns, _ = waiters[0]
            if not d.holder.try_spend(now_ms, a.amount).admitted:
                self._ask(d, now_ms, a.amount)
                break
            waiters.popleft()
            self.admitted += a.amount
            self.waits_ms.append((t_ns - since_ns) // MS)
            self.resolved(a, True, t_ns)
        self._maintain(d.worker, d.tenant, d, now_ms)

    def _expire(self, d: _Driver, t_ns: int) -> None:
        """A deadline passed: deny the waiters it covers. The verdict says `governor_unreachable`
        when that is why no block came (the node's deadline verdict carries the suspension)."""
        waiters = d.waiters
        while waiters and waiters[0][2] <= t_ns:
            a = waiters.popleft()[0]
            self._deny(
                GOVERNOR_UNREACHABLE if self._unreachable(d, t_ns // MS) else DEADLINE_EXCEEDED
            )
            self.resolved(a, False, t_ns)

    def _unreachable(self, d: _Driver, now_ms: int) -> bool:
        """What the holder's verdict would say (`CreditHolder.why_not`), without a spend."""
        return d.holder.why_not(now_ms) == GOVERNOR_UNREACHABLE

    def _maintain(self, worker: str, tenant: str, d: _Driver, now_ms: int) -> None:
        loop = d.loop
        loop.overdue(now_ms)  # unanswered too long (its resends lost): ask afresh
        if d.holder.in_flight is None and now_ms >= loop.retry_at_ms and now_ms >= d.refill_at_ms:
            # the node looks at refills ahead of need once a tick (`CreditDesk.tick`)
            d.refill_at_ms = now_ms + REFILL_TICK_MS
            request = loop.ahead(now_ms)
            if request is not None:
                d.rid = f"{worker}/{next(self.rids)}"
                self._reserve(worker, tenant, d, request, d.rid, now_ms * MS)
        if d.holder.blocks:  # else nothing to give back (a late grant went back at once)
            for block_id, unused in loop.returns(now_ms):
                self._return(worker, block_id, unused, now_ms * MS)

    def _reserve(
        self, worker: str, tenant: str, d: _Driver, request: Reserve, rid: str, now_ns: int
    ) -> None:
        self.calls += 1
        self.wait_sends += len(d.waiters)  # each request waiting on this holder waits on it

        def resend(t: int) -> None:
            if d.holder.in_flight is request and self.drivers.get((worker, tenant)) is d:
                self._reserve(worker, tenant, d, request, rid, t)

        self._at(now_ns + RESEND_MS * MS, resend)
        self._send(
            worker,
            GOVERNORD,
            now_ns,
            lambda t: self._on_reserve(worker, tenant, d, request, rid, t),
        )

    def _on_reserve(
        self, worker: str, tenant: str, d: _Driver, request: Reserve, rid: str, t_ns: int
    ) -> None:
        """governord answers whatever reaches it, even a request the worker gave up on."""
        if self.engine is None:
            return  # down: no reply
        got = self.engine.reserve_credit(
            self.sessions[worker],
            self.nodes[tenant],
            self.resources[tenant],
            request.units,
            request_id=rid,
        )
        self._send(GOVERNORD, worker, t_ns, lambda t: self._on_reply(d, request, got, t))

    def _on_reply(self, d: _Driver, request: Reserve, got: object, t_ns: int) -> None:
        if d.holder.in_flight is not request:
            return  # a duplicate or a late reply: the block stays counted until it expires
        now_ms = t_ns // MS
        if isinstance(got, CreditGrant):
            block = d.loop.granted(
                now_ms, request, got.block_id, got.units, got.ttl_ms, instant=t_ns
            )
            assert block is not None, "governord's engine grants a new block id"
            if block.block_id not in d.holder.blocks:  # past its local expiry: back whole
                for block_id, unused in d.loop.returns(now_ms):
                    self._return(d.worker, block_id, unused, t_ns)
        else:  # an empty bucket's denial states its B
            assert isinstance(got, Denial)
            burst = got.limit if got.reason is DenyReason.RATE and got.limit > 0 else None
            d.loop.denied(now_ms, request, burst, instant=t_ns)
        if d.waiters and self.drivers.get((d.worker, d.tenant)) is d:
            self._serve(d, t_ns)

    def _return(self, worker: str, block_id: int, unused: int, now_ns: int) -> None:
        self.calls += 1

        def apply(t: int) -> None:
            if self.engine is not None:
                self.engine.return_credit(self.sessions[worker], block_id, unused)
                self.messages += 1  # the answer; the worker does not wait for it

        self._send(worker, GOVERNORD, now_ns, apply)

    # ---- faults ----------------------------------------------------------------------------

    def crash(self, worker: str, now_ns: int) -> None:
        """The worker's holders die with it, and its waiters' requests fail with it; its
        blocks stay counted until they expire."""
        super().crash(worker, now_ns)
        for key in sorted(k for k in self.drivers if k[0] == worker):
            waiters = self.drivers.pop(key).waiters
            while waiters:  # emptied, so their deadlines find nothing left to deny
                self._deny(WORKER_GONE)
                self.resolved(waiters.popleft()[0], False, now_ns)

    def leave(self, worker: str, now_ns: int) -> None:
        for (w, _), d in sorted(self.drivers.items()):
            if w == worker:
                for block_id, unused in d.loop.returns(now_ns // MS, leaving=True):
                    self._return(worker, block_id, unused, now_ns)
        self.crash(worker, now_ns)

    def policy_changed(self, tenant: str, p: Policy, now_ns: int) -> None:
        """The operator's SetRate; while governord is down it is applied at the restart."""
        if self.engine is None:
            self.pending_rates.append((tenant, p))
            return
        self.engine.set_rate(
            None, self.nodes[tenant], self.resources[tenant], Rate(p.rate, p.burst)
        )
        self.bursts[tenant] = p.burst  # what a holder made from now on reads

    # ---- the report ------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """What the runner cannot see: calls to governord, its restarts, denial reasons. The
        envelope figures come from the runner's own record of admissions, not from here."""
        return {
            "governor_calls_per_admitted": round(self.calls / max(self.admitted, 1), 4),
            "governord_restarts": self.restarts,
            "denials": dict(sorted(self.denials.items())),
            **_waits(self.waits_ms, self.waited, self.wait_sends),
        }


def _waits(waits_ms: list[int], waited: int, sends: int) -> dict[str, Any]:
    """How the requests that waited for a block fared: how many, the reserves each waited on
    (a mean: more than one when a reserve was denied, partly granted or lost), and how long
    the admitted ones waited (ms, nearest rank)."""
    out: dict[str, Any] = {
        "waited": waited,
        "waited_admitted": len(waits_ms),
        "wait_round_trips": round(sends / waited, 3) if waited else 0.0,
    }
    if waits_ms:
        p50, p99, top = percentiles(waits_ms, 0.50, 0.99, 1.0)
        out["wait_ms"] = {"p50": p50, "p99": p99, "max": top}
    return out


def _comparable(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without what a restart renews on purpose (each open session's expiry)."""
    sessions = [{k: v for k, v in s.items() if k != "expires_ms"} for s in snapshot["sessions"]]
    return {**snapshot, "sessions": sessions}

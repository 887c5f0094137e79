"""`strict`: governord's credit blocks, the real code on both sides, on the virtual clock.

One ``governor.engine.Engine`` (a rated node per tenant under the root, one session per
worker) and one ``ratemesh.credit.CreditHolder`` per (worker, tenant). ``ReserveCredit`` and
``ReturnCredit`` and their replies cross the scenario's network as messages (latency, jitter,
loss, duplication). The hot path is credit only: no mesh check in front, since the mesh's
veto changes no bound here and composing the two would measure the mesh twice.

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
from collections.abc import Callable
from typing import Any

from governor.engine import (
    ROOT_ID,
    Created,
    CreditGrant,
    Engine,
    EngineConfig,
    Event,
    Rate,
)
from mesh.core.config import MS
from ratemesh.credit import CreditConfig, CreditHolder, Reserve, local_expiry_ms
from sim.scenario import Policy
from sim.strategies.base import Context, Strategy
from sim.workload import Arrival

__all__ = ["StrictStrategy", "GOVERNORD", "CREDIT_TTL_MS", "local_life_ms"]

GOVERNORD = "governord"
CREDIT_TTL_MS = 2_000  # short, so an outage shows the fail-closed edge within a short run
SESSION_TTL_MS = 86_400_000  # workers' sessions outlive any run (heartbeats not simulated)
SNAPSHOT_EVERY_EVENTS = 5_000
RESEND_MS = 100  # an unanswered reserve is resent, same request id, this often, until
# the holder's unreachable_after_ms; then a new request (new id, new send time) replaces it
JOINERS_MAX = 64  # as sim.scenario: a join fault may name up to this many new ids
SWEEP_MS = 250  # idle holders give back their credit on this tick, not only on demand
# as governor.client's StrictCredit: a denied reserve backs off, doubling
DENIED_BACKOFF_MIN_MS = 10
DENIED_BACKOFF_MAX_MS = 500
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
    """One worker's holder for one tenant, driven as ``StrictCredit`` drives it."""

    __slots__ = ("holder", "pending", "rid", "first_ms", "retry_at_ms", "backoff_ms", "wanted_ms")

    def __init__(self) -> None:
        self.holder = CreditHolder(HOLDER_CONFIG)
        self.pending: Reserve | None = None
        self.rid = ""
        self.first_ms = 0
        self.retry_at_ms = 0
        self.backoff_ms = 0
        self.wanted_ms = 0  # the last admission asked of it


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
        self.sessions: dict[str, int] = {}
        self.drivers: dict[tuple[str, str], _Driver] = {}
        self.rids = itertools.count(1)
        # ReserveCredit and ReturnCredit sent, resends included; not hot-path round trips
        # (`round_trips` stays 0): a worker decides from what it holds and never waits
        self.calls = 0
        self.admitted = 0  # units, for governor calls per admitted unit
        self.denials: dict[str, int] = {}  # reason -> requests denied (no_credit, ...)
        self.pending_rates: list[tuple[str, Policy]] = []  # SetRate while governord is down
        self._setup(ctx)
        self._at(0, self._sweep)

    # ---- governord -------------------------------------------------------------------------

    def _setup(self, ctx: Context) -> None:
        eng = self.engine
        assert eng is not None
        for tenant in sorted(ctx.tenants):
            p = ctx.tenants[tenant].policy
            got = eng.create_node(
                None, ROOT_ID, tenant, rates={p.metric.value: Rate(p.rate, p.burst)}
            )
            assert isinstance(got, Created), got
            self.nodes[tenant] = got.node_id
            self.resources[tenant] = p.metric.value
        joiners = [f"w{j:04d}" for j in range(len(ctx.workers), len(ctx.workers) + JOINERS_MAX)]
        for i, w in enumerate(ctx.workers + joiners):
            token = hashlib.sha256(f"{w}/{i}".encode()).hexdigest()
            self.sessions[w], _ = eng.open_session(ROOT_ID, SESSION_TTL_MS, token)

    def _durable(self) -> None:
        """Compact the in-memory log into a snapshot now and then (the store's job)."""
        if self.engine is not None and len(self.log) >= SNAPSHOT_EVERY_EVENTS:
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
        while self.queue and self.queue[0][0] <= t_ns:
            when, _, fn = heapq.heappop(self.queue)
            self.clock.ms = max(self.clock.ms, when // MS)
            fn(when)
        self._durable()

    def _sweep(self, t_ns: int) -> None:
        """Idle returns, and the owner that shrinks `drivers`: a holder idle for `idle_ms`
        with nothing held or asked is dropped (its demand history is stale by then)."""
        now_ms = t_ns // MS
        idle_ms = HOLDER_CONFIG.idle_ms
        for key in sorted(self.drivers):
            d = self.drivers[key]
            self._maintain(key[0], key[1], d, now_ms)
            if not d.holder.blocks and d.pending is None and now_ms - d.wanted_ms >= idle_ms:
                del self.drivers[key]
        self._at(t_ns + SWEEP_MS * MS, self._sweep)

    def _send(self, src: str, dst: str, now_ns: int, fn: Callable[[int], None]) -> None:
        self.messages += 1
        for delay in self.ctx.network.transit(src, dst, now_ns):
            self._at(now_ns + delay, fn)

    # ---- the worker ------------------------------------------------------------------------

    def admit(self, a: Arrival, now_ns: int) -> bool:
        key = (a.worker, a.tenant)
        d = self.drivers.get(key)
        if d is None:
            d = self.drivers[key] = _Driver()
        now_ms = d.wanted_ms = now_ns // MS
        verdict = d.holder.try_spend(now_ms, a.amount)
        self._maintain(a.worker, a.tenant, d, now_ms)
        if verdict.admitted:
            self.admitted += a.amount
        elif verdict.reason is not None:  # a few fixed reasons: a bounded map
            self.denials[verdict.reason] = self.denials.get(verdict.reason, 0) + 1
        return verdict.admitted

    def _maintain(self, worker: str, tenant: str, d: _Driver, now_ms: int) -> None:
        if d.pending is not None and now_ms - d.first_ms >= d.holder.config.unreachable_after_ms:
            # give up on it (governord unreachable) and ask afresh: a block is timed from its
            # request's first send, so an old request's reply would bring little or no life
            d.holder.failed(d.pending, unreachable=True)
            d.pending = None
        if d.pending is None and now_ms >= d.retry_at_ms:
            request = d.holder.refill(now_ms)
            if request is not None:
                d.pending, d.rid, d.first_ms = request, f"{worker}/{next(self.rids)}", now_ms
                self._reserve(worker, tenant, d, request, d.rid, now_ms * MS)
        for block_id, unused in d.holder.take_returns(now_ms):
            self._return(worker, block_id, unused, now_ms * MS)

    def _reserve(
        self, worker: str, tenant: str, d: _Driver, request: Reserve, rid: str, now_ns: int
    ) -> None:
        self.calls += 1

        def resend(t: int) -> None:
            if d.pending is request and self.drivers.get((worker, tenant)) is d:
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
        if d.pending is not request:
            return  # a duplicate or a late reply: the block stays counted until it expires
        d.pending = None
        now_ms = t_ns // MS
        if isinstance(got, CreditGrant):
            d.holder.granted(now_ms, request, got.block_id, got.units, got.ttl_ms)
            d.backoff_ms = 0
            if got.units < request.units:  # a drained bucket: gather more per round trip
                d.retry_at_ms = now_ms + d.holder.config.lead_ms
        else:
            d.holder.failed(request, unreachable=False)
            d.backoff_ms = min(DENIED_BACKOFF_MAX_MS, max(DENIED_BACKOFF_MIN_MS, d.backoff_ms * 2))
            d.retry_at_ms = now_ms + d.backoff_ms

    def _return(self, worker: str, block_id: int, unused: int, now_ns: int) -> None:
        self.calls += 1

        def apply(t: int) -> None:
            if self.engine is not None:
                self.engine.return_credit(self.sessions[worker], block_id, unused)
                self.messages += 1  # the answer; the worker does not wait for it

        self._send(worker, GOVERNORD, now_ns, apply)

    # ---- faults ----------------------------------------------------------------------------

    def crash(self, worker: str, now_ns: int) -> None:
        """The worker's holders die with it; its blocks stay counted until they expire."""
        super().crash(worker, now_ns)
        for key in [k for k in self.drivers if k[0] == worker]:
            del self.drivers[key]

    def leave(self, worker: str, now_ns: int) -> None:
        for (w, _), d in sorted(self.drivers.items()):
            if w == worker:
                for block_id, unused in d.holder.take_returns(now_ns // MS, leaving=True):
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

    # ---- the report ------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """What the runner cannot see: calls to governord, its restarts, denial reasons. The
        envelope figures come from the runner's own record of admissions, not from here."""
        return {
            "governor_calls_per_admitted": round(self.calls / max(self.admitted, 1), 4),
            "governord_restarts": self.restarts,
            "denials": dict(sorted(self.denials.items())),
        }


def _comparable(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without what a restart renews on purpose (each open session's expiry)."""
    sessions = [{k: v for k, v in s.items() if k != "expires_ms"} for s in snapshot["sessions"]]
    return {**snapshot, "sessions": sessions}

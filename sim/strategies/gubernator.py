"""`gubernator-global`: a model of Gubernator's GLOBAL behaviour, for comparison.

* The peer that receives a request answers from its own cached copy of the bucket; a cache
  miss starts a full bucket on that peer (so a key seen everywhere at once is admitted
  N times over).
* Hits are forwarded to the owner asynchronously, without ids or retries: a lost batch is
  lost. Batches go out every GlobalSyncWait (100 ms) or at 1,000 keys.
* The owner applies hits to its bucket (hits beyond what remains change nothing: the
  default, non-draining behaviour) and broadcasts its state to every peer every 100 ms.
* A broadcast overwrites the peer's copy with the owner's `remaining`; there is no
  staleness limit, so a peer that stops hearing keeps spending its copy.

To keep 1,000 peers tractable a broadcast round is one event: one delay drawn for the
round, loss drawn per peer, and peers adopt the newest state they received lazily, when
they next look the key up. The admission arithmetic is the same GCRA the mesh uses.
"""

from __future__ import annotations

from mesh.core.gcra import Gcra
from mesh.core.policy import RateKey
from mesh.core.ring import Ring
from mesh.testing.fleet import Scheduler
from sim.scenario import Policy
from sim.strategies.base import Context, Strategy
from sim.workload import Arrival

__all__ = ["GubernatorStrategy"]

GLOBAL_SYNC_WAIT_NS = 100_000_000
GLOBAL_BATCH_LIMIT = 1000
MEMBERSHIP_DELAY_NS = 50_000_000


class _Broadcast:
    __slots__ = ("deliver_at", "version", "remaining", "observed_at", "lost")

    def __init__(
        self, deliver_at: int, version: int, remaining: int, observed_at: int, lost: frozenset[str]
    ) -> None:
        self.deliver_at = deliver_at
        self.version = version
        self.remaining = remaining
        self.observed_at = observed_at
        self.lost = lost


class _Copy:
    __slots__ = ("meter", "version")

    def __init__(self, meter: Gcra, version: int) -> None:
        self.meter = meter
        self.version = version


class GubernatorStrategy(Strategy):
    name = "gubernator-global"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.sched = Scheduler()
        self.ring = Ring(ctx.workers, 1)
        self.policy: dict[str, Policy] = {t: i.policy for t, i in ctx.tenants.items()}
        self.copies: dict[str, dict[str, _Copy]] = {w: {} for w in ctx.workers}
        self.hits: dict[str, dict[str, int]] = {w: {} for w in ctx.workers}
        self.owned: dict[str, dict[str, Gcra]] = {w: {} for w in ctx.workers}
        self.updated: dict[str, set[str]] = {w: set() for w in ctx.workers}
        self.broadcasts: dict[str, list[_Broadcast]] = {}
        self.version = 0
        self.alive = set(ctx.workers)
        n = len(ctx.workers)
        for i, w in enumerate(ctx.workers):
            self.sched.at(i * GLOBAL_SYNC_WAIT_NS // n, self._sync, w)

    # -- placement and buckets ------------------------------------------------------------

    def owner_of(self, tenant: str, metric: str = "read_iops") -> str | None:
        return self.ring.owner_of(RateKey(tenant, metric, 1))

    def _new_meter(self, tenant: str, now_ns: int) -> Gcra:
        p = self.policy[tenant]
        return Gcra(p.rate, p.burst, now_ns)

    def _owner_bucket(self, w: str, tenant: str, now_ns: int) -> Gcra:
        b = self.owned[w].get(tenant)
        if b is None:
            b = self.owned[w][tenant] = self._new_meter(tenant, now_ns)
        return b

    def _copy(self, w: str, tenant: str, now_ns: int) -> _Copy:
        c = self.copies[w].get(tenant)
        newest = None
        for bc in reversed(self.broadcasts.get(tenant, ())):
            if bc.deliver_at <= now_ns and w not in bc.lost:
                newest = bc
                break
        if newest is not None and (c is None or newest.version > c.version):
            meter = self._new_meter(tenant, newest.observed_at)
            meter.apply(newest.observed_at, meter.burst - newest.remaining)  # overwrite
            c = self.copies[w][tenant] = _Copy(meter, newest.version)
        elif c is None:
            c = self.copies[w][tenant] = _Copy(self._new_meter(tenant, now_ns), 0)  # full
        return c

    # -- the hot path ----------------------------------------------------------------------

    def admit(self, a: Arrival, now_ns: int) -> bool:
        w, tenant = a.worker, a.tenant
        if self.owner_of(tenant, a.metric) == w:
            self.updated[w].add(tenant)
            return self._owner_bucket(w, tenant, now_ns).try_take(now_ns, a.amount)
        ok = self._copy(w, tenant, now_ns).meter.try_take(now_ns, a.amount)
        hits = self.hits[w]
        hits[tenant] = hits.get(tenant, 0) + a.amount
        if len(hits) >= GLOBAL_BATCH_LIMIT:
            self._send_hits(w, now_ns)
        return ok

    # -- background ------------------------------------------------------------------------

    def advance(self, t_ns: int) -> None:
        self.sched.run_until(t_ns)

    def _sync(self, w: str) -> None:
        if w not in self.alive:
            return
        now = self.sched.now_ns
        self._send_hits(w, now)
        self._broadcast(w, now)
        self.sched.at(now + GLOBAL_SYNC_WAIT_NS, self._sync, w)

    def _send_hits(self, w: str, now_ns: int) -> None:
        hits, self.hits[w] = self.hits[w], {}
        by_owner: dict[str, dict[str, int]] = {}
        for tenant, n in hits.items():
            owner = self.owner_of(tenant)
            assert owner is not None
            by_owner.setdefault(owner, {})[tenant] = n
        net = self.ctx.network
        for owner in sorted(by_owner):
            if owner == w:
                self._apply_hits(owner, by_owner[owner])
                continue
            self.messages += 1
            for d in net.transit(w, owner, now_ns):  # no ids, no retries: lost is lost
                self.sched.at(now_ns + d, self._apply_hits, owner, by_owner[owner])

    def _apply_hits(self, owner: str, hits: dict[str, int]) -> None:
        if owner not in self.alive:
            return
        now = self.sched.now_ns
        for tenant, n in hits.items():
            b = self._owner_bucket(owner, tenant, now)
            if b.remaining(now) >= n:
                b.apply(now, n)
            # else: OVER_LIMIT, and the bucket is left as it is (no DRAIN_OVER_LIMIT)
            self.updated[owner].add(tenant)

    def _broadcast(self, w: str, now_ns: int) -> None:
        updated, self.updated[w] = self.updated[w], set()
        if not updated:
            return
        net = self.ctx.network
        self.messages += len(self.alive) - 1
        if net.perfect():
            lost: frozenset[str] = frozenset()
        else:
            lost = frozenset(
                p for p in sorted(self.alive) if p != w and not net.transit(w, p, now_ns)
            )
        delay = net.delay_ns()
        for tenant in sorted(updated):
            self.version += 1
            b = self._owner_bucket(w, tenant, now_ns)
            history = self.broadcasts.setdefault(tenant, [])
            history.append(
                _Broadcast(now_ns + delay, self.version, b.remaining(now_ns), now_ns, lost)
            )
            if len(history) > 4:
                del history[0]

    # -- faults ----------------------------------------------------------------------------

    def crash(self, worker: str, now_ns: int) -> None:
        super().crash(worker, now_ns)
        self.alive.discard(worker)
        for d in (self.copies, self.hits, self.owned):
            d[worker] = {}
        self.updated[worker] = set()
        live = list(self.live)
        self.sched.at(now_ns + MEMBERSHIP_DELAY_NS, self._set_ring, live)

    def _set_ring(self, members: list[str]) -> None:
        self.ring = self.ring.with_members(members)

    def restart(self, worker: str, now_ns: int) -> None:
        super().restart(worker, now_ns)
        self.alive.add(worker)
        for d in (self.copies, self.hits, self.owned):
            d[worker] = {}
        self.updated[worker] = set()
        self.ring = self.ring.with_members(self.live)
        self.sched.at(now_ns + GLOBAL_SYNC_WAIT_NS, self._sync, worker)

    def policy_changed(self, tenant: str, p: Policy, now_ns: int) -> None:
        self.policy[tenant] = p
        for per_peer in (self.owned,):
            for buckets in per_peer.values():
                if tenant in buckets:
                    buckets[tenant].retune(p.rate, p.burst, now_ns)
        for copies in self.copies.values():
            if tenant in copies:
                copies[tenant].meter.retune(p.rate, p.burst, now_ns)

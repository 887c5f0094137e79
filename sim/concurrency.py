"""An in-flight cap scenario (docs/policies.md, concurrency): the real slot core
(`mesh.core.concurrency`) on a virtual clock and the scenario's network, one seed deciding
everything.

Each arrival asks its worker for a slot and, admitted, holds it for `hold_ms`; a denied one
is turned away. Strategies: `mesh`, the global mode (each worker a SlotDesk reporting to the
scope's owner, a SlotOwner, and holding what it grants); `share`, each worker capped at
ceil(C / N_live); `local`, each at C. Faults: `crash` takes workers down (their slots go
with them, their arrivals go to a live worker) and brings them back empty under a new
epoch; `crash_owner` does that to the busiest tenant's owner; `partition` cuts members off.

The keys are the simulator's (DESIGN.md section 5), read for a cap on a gauge: the fleet's
in-flight total per tenant is sampled at every step; `max_excess` is the most it passed C;
`bound` the mode's disclosed excess (global: N x b; share: N x ceil(C/N) - C; local:
(N - 1) x C); `ideal` is min(offered, C x duration / hold) per tenant.
"""

from __future__ import annotations

import heapq
import random
from typing import Any

from mesh.core.concurrency import (
    SlotDesk,
    SlotGrant,
    SlotOwner,
    SlotReport,
    SlotTimings,
    global_excess,
    ring_key,
)
from mesh.core.config import MS
from mesh.core.gcra import NS_PER_S
from mesh.core.ring import Ring
from mesh.core.shares import share_of
from ratemesh.policy import Mode, TenantRatePolicy
from sim.network import ScenarioNetwork
from sim.quota import fairness_figures, run_result
from sim.scenario import ConcurrencySpec, Scenario
from sim.workload import Workload

__all__ = ["CONCURRENCY_STRATEGIES", "run_concurrency"]

CONCURRENCY_STRATEGIES = {"mesh": Mode.GLOBAL, "share": Mode.SHARE, "local": Mode.LOCAL}


class _Run:
    def __init__(self, sc: Scenario, seed: int, strategy: str) -> None:
        assert sc.concurrency is not None
        self.sc, self.spec = sc, sc.concurrency
        self.mode = CONCURRENCY_STRATEGIES[strategy]
        self.workers = sc.worker_ids()
        self.start = int(sc.warmup_s * NS_PER_S)
        self.t = self.start
        self.workload = Workload(sc, seed, self.workers, self.start)
        self.net = ScenarioNetwork(sc.network, random.Random(f"network/{seed}"))
        self.names = sorted(self.workload.tenants)
        spec: ConcurrencySpec = self.spec
        self.policies = {
            n: TenantRatePolicy(
                n,
                sc.policy.metric,
                1,
                concurrency=spec.cap,
                local_burst_cap=spec.local_burst_cap or spec.cap,
                mode=self.mode,
            )
            for n in self.names
        }
        self.timings = SlotTimings(lease_ttl_ms=spec.lease_ttl_ms, member_ttl_ms=spec.member_ttl_ms)
        self.ring = Ring(self.workers, 1)
        self.epochs = dict.fromkeys(self.workers, 1)
        self.desks = {w: SlotDesk(w, 1, self.timings) for w in self.workers}
        self.owners = {w: SlotOwner(w, self.timings) for w in self.workers}
        self.down: set[str] = set()
        self.inflight: list[tuple[int, int, str, str, SlotReport | SlotGrant]] = []
        self.releases: list[tuple[int, int, str, int, int]] = []  # (at, seq, worker, epoch, lease)
        self.seq = 0
        self.messages = 0
        self.held = dict.fromkeys(self.names, 0)  # the fleet's true in-flight, per tenant
        self.by_worker: dict[tuple[str, str], int] = {}  # (worker, tenant) -> held
        self.admitted = dict.fromkeys(self.names, 0)
        self.offered = dict.fromkeys(self.names, 0)
        self.max_excess = dict.fromkeys(self.names, 0)
        self.peak = dict.fromkeys(self.names, 0)  # the most each tenant's fleet held at once
        self.live_min = len(self.workers)

    def now_ms(self) -> int:
        return self.t // MS

    def _send(self, src: str, to: str, msg: SlotReport | SlotGrant) -> None:
        self.messages += 1
        if to in self.down or src in self.down:
            return
        delays = [0] if to == src else self.net.transit(src, to, self.t)
        for d in delays:
            self.seq += 1
            heapq.heappush(self.inflight, (self.t + d, self.seq, src, to, msg))

    def _deliver(self) -> None:
        while self.inflight and self.inflight[0][0] <= self.t:
            _, _, src, to, msg = heapq.heappop(self.inflight)
            if to in self.down:
                continue
            if isinstance(msg, SlotReport):
                grant = self.owners[to].receive(
                    self.now_ms(), src, msg, self.policies[msg.scope[0]]
                )
                if grant is not None:
                    self._send(to, src, grant)
            else:
                self.desks[to].receive(self.now_ms(), src, msg, self.ring)

    def _crash(self, w: str, phase: str) -> None:
        if phase == "start":
            self.down.add(w)
            for t in self.names:  # its slots go with the process
                self.held[t] -= self.by_worker.pop((w, t), 0)
        else:
            self.down.discard(w)
            self.epochs[w] += 1
            self.desks[w] = SlotDesk(w, self.epochs[w], self.timings)
            self.owners[w] = SlotOwner(w, self.timings)

    def fault(self, kind: str, members: tuple[str, ...], tenant: str | None, phase: str) -> None:
        if kind == "crash":
            for w in members:
                self._crash(w, phase)
        elif kind == "crash_owner" and tenant is not None:
            self._crash(self.ring.owner_of(ring_key((tenant, self.sc.policy.metric))), phase)
        elif kind == "partition":
            group = frozenset(members)
            if phase == "start":
                self.net.partitions.append(group)
            elif group in self.net.partitions:
                self.net.partitions.remove(group)

    def acquire(self, worker: str, tenant: str) -> None:
        self.offered[tenant] += 1
        live = len(self.workers) - len(self.down)
        v = self.desks[worker].acquire(self.policies[tenant], self.now_ms(), live)
        if not v.allowed:
            return
        self.admitted[tenant] += 1
        self.held[tenant] += 1
        k = (worker, tenant)
        self.by_worker[k] = self.by_worker.get(k, 0) + 1
        self.seq += 1
        at = self.t + self.spec.hold_ms * MS
        heapq.heappush(self.releases, (at, self.seq, worker, self.epochs[worker], v.lease))

    def _release_due(self) -> None:
        while self.releases and self.releases[0][0] <= self.t:
            _, _, w, epoch, lease = heapq.heappop(self.releases)
            if epoch != self.epochs[w] or w in self.down:
                continue  # that process is gone, and its slots with it
            scope = self.desks[w].leases[lease].scope
            assert self.desks[w].release(lease)
            self.held[scope[0]] -= 1
            self.by_worker[(w, scope[0])] -= 1

    def run(self) -> dict[str, Any]:
        sc = self.sc
        end = self.start + int(sc.duration_s * NS_PER_S)
        events = sorted(
            [(self.start + int(f.at_s * NS_PER_S), 0, "start", f) for f in sc.faults]
            + [
                (self.start + int(f.until_s * NS_PER_S), 1, "end", f)
                for f in sc.faults
                if f.until_s is not None
            ],
            key=lambda e: (e[0], e[1]),
        )
        sync_ns = sc.fleet.sync_interval_ms * MS
        next_sync = self.start
        c = self.spec.cap
        while self.t < end:
            self.t += self.workload.step_ns
            while events and events[0][0] <= self.t:
                _, _, phase, f = events.pop(0)
                self.fault(f.kind, f.members, f.tenant, phase)
            live = [w for w in self.workers if w not in self.down]
            self.live_min = min(self.live_min, len(live))
            self._release_due()
            if self.mode is Mode.GLOBAL:
                self._deliver()
                if self.t >= next_sync:
                    next_sync = self.t + sync_ns
                    for w in live:
                        for to, report in self.desks[w].tick(self.now_ms(), self.ring):
                            self._send(w, to, report)
                        self.owners[w].tick(self.now_ms())
            for a in self.workload.step(self.t):
                w = a.worker if a.worker in live else live[self.workers.index(a.worker) % len(live)]
                self.acquire(w, a.tenant)
            for t in self.names:
                self.peak[t] = max(self.peak[t], self.held[t])
                self.max_excess[t] = max(self.max_excess[t], self.held[t] - c)
        return self.summary()

    def bound(self) -> int:
        n, c = len(self.workers), self.spec.cap
        if self.mode is Mode.GLOBAL:
            return global_excess(n, self.spec.local_burst_cap or c)
        if self.mode is Mode.SHARE:  # the share of the smallest live fleet, held by all N
            return n * share_of(c, self.live_min) - c
        return (n - 1) * c

    def summary(self) -> dict[str, Any]:
        sc, c, n = self.sc, self.spec.cap, len(self.workers)
        slot_time = int(c * sc.duration_s * 1000 / self.spec.hold_ms)
        ideal = {t: min(o, slot_time) for t, o in self.offered.items()}
        jain, quiet_share = fairness_figures(sc, self.admitted, self.offered, ideal)
        worst = max(self.max_excess.values())
        bound = self.bound()
        return {
            "admitted": sum(self.admitted.values()),
            "ideal": sum(ideal.values()),
            "max_excess": worst,
            "mean_excess": round(sum(self.max_excess.values()) / len(self.max_excess), 3),
            "mean_excess_pct_of_rate": round(100 * worst / c, 3),
            "bound": bound,
            "within_bound": worst <= bound,
            "utilisation": round(sum(self.admitted.values()) / max(sum(ideal.values()), 1), 4),
            "fairness": jain,
            "quiet_share": quiet_share,
            "messages_per_worker_s": round(self.messages / n / sc.duration_s, 2),
            "round_trips_per_request": 0.0,  # acquire is local; reports and grants are off-path
            "cap": c,
            "local_burst_cap": self.spec.local_burst_cap or c,
            "per_tenant": {
                t: {
                    "admitted": self.admitted[t],
                    "offered": self.offered[t],
                    "max_in_flight": self.peak[t],
                }
                for t in sorted(self.admitted)
            },
        }


def run_concurrency(sc: Scenario, seed: int, strategies: list[str] | None = None) -> dict[str, Any]:
    """Every concurrency strategy on the scenario, one seed; the simulator's result shape."""
    names = [s for s in (strategies or sc.strategies) if s in CONCURRENCY_STRATEGIES]
    return run_result(sc, seed, {name: _Run(sc, seed, name).run() for name in names})

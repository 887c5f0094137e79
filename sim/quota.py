"""A spend-quota scenario (docs/quotas.md): the real quota core (`mesh.core.quota`) on a
virtual clock and the scenario's network, one seed deciding everything.

Strategies: `mesh`, each worker a QuotaDesk publishing its cells to the key's owner and
folding the answers (remote = combined - own); `local`, each worker enforcing the cap on
its own burn alone (fleet <= N x cap). A `crash_owner` fault takes the busiest key's owner
down (messages to it are lost, its arrivals go to a live worker) and brings it back with
nothing: its folds and its own ledger are gone, it recovers its cell from the hello, and
the others re-publish (a ring change).

The keys are the simulator's (DESIGN.md section 5), read for a quota: `ideal` is
min(offered, cap) per tenant, `max_excess` the most a tenant's fleet burn passed its cap,
and the mesh's `bound` what the seed claims: the peers' burn the last admitting worker had
not yet folded (true peer burn - its remote then); local's is (N-1) x cap.
"""

from __future__ import annotations

import heapq
import random
from typing import Any

from mesh.core.config import MS
from mesh.core.effects import Send
from mesh.core.gcra import NS_PER_S
from mesh.core.messages import CellFold, CellPublish, decode, encode
from mesh.core.policy import PolicyCache, TenantRatePolicy
from mesh.core.quota import QuotaDesk, QuotaLedger
from mesh.core.ring import Ring
from ratemesh.policy import Period
from sim.network import ScenarioNetwork
from sim.scenario import Scenario
from sim.workload import Workload

__all__ = ["QUOTA_STRATEGIES", "fairness_figures", "run_quota", "run_result"]

QUOTA_STRATEGIES = ("mesh", "local")
T0_MS = 1_774_958_400_000  # 2026-03-31 12:00 UTC: the run stays inside one day


def _policies(sc: Scenario, names: list[str]) -> list[TenantRatePolicy]:
    assert sc.quota is not None
    cap = sc.quota.cap
    return [
        TenantRatePolicy(
            n,
            sc.policy.metric,
            1,
            unit=sc.policy.metric_unit,
            period=Period.DAY,
            quota=cap,
        )
        for n in names
    ]


class _Run:
    def __init__(self, sc: Scenario, seed: int, strategy: str) -> None:
        assert sc.quota is not None
        self.sc, self.strategy = sc, strategy
        self.workers = sc.worker_ids()
        self.start = int(sc.warmup_s * NS_PER_S)
        self.t = self.start
        self.workload = Workload(sc, seed, self.workers, self.start)
        self.net = ScenarioNetwork(sc.network, random.Random(f"network/{seed}"))
        names = sorted(self.workload.tenants)
        self.policies = {p.tenant_id: p for p in _policies(sc, names)}
        self.cache = PolicyCache(self.policies.values())
        self.ring = Ring(self.workers, 1)
        self.desks = {w: self._desk(w) for w in self.workers}
        self.local = {w: QuotaLedger(w) for w in self.workers}
        self.inflight: list[tuple[int, int, str, str, CellPublish | CellFold]] = []
        self.seq = 0
        self.messages = 0
        self.down: set[str] = set()
        self.admitted = dict.fromkeys(names, 0)
        self.offered = dict.fromkeys(names, 0)
        self.burn: dict[tuple[str, str], int] = {}  # (worker, tenant) -> true burn
        self.last_lag = dict.fromkeys(names, 0)

    def _desk(self, w: str) -> QuotaDesk:
        assert self.sc.quota is not None
        return QuotaDesk(w, self.cache, self.now_ms, publish_ms=self.sc.quota.publish_ms)

    def now_ms(self) -> int:
        return T0_MS + self.t // MS

    def _send(self, src: str, sends: list[Any]) -> None:
        for e in sends:
            assert isinstance(e, Send)
            self.messages += 1
            msg = decode(encode(e.message))  # what crosses the wire, validated
            assert isinstance(msg, (CellPublish, CellFold))
            if e.to in self.down or src in self.down:
                continue
            delays = [0] if e.to == src else self.net.transit(src, e.to, self.t)
            for d in delays:
                self.seq += 1
                heapq.heappush(self.inflight, (self.t + d, self.seq, src, e.to, msg))

    def _deliver(self) -> None:
        while self.inflight and self.inflight[0][0] <= self.t:
            _, _, src, to, msg = heapq.heappop(self.inflight)
            if to not in self.down:
                self._send(to, self.desks[to].receive(src, msg))

    def fault(self, kind: str, tenant: str | None, phase: str) -> None:
        if kind != "crash_owner" or tenant is None:
            return
        owner = self.ring.owner_of(self.policies[tenant].rate_key)
        if phase == "start":
            self.down.add(owner)
        else:  # back, with nothing: a restart under the same id
            self.down.discard(owner)
            self.desks[owner] = self._desk(owner)
            for d in self.desks.values():
                d.ring_changed()

    def spend(self, worker: str, tenant: str, amount: int) -> None:
        p = self.policies[tenant]
        self.offered[tenant] += amount
        now = self.now_ms()
        if self.strategy == "local":
            allowed = self.local[worker].try_spend(now, p, amount).allowed
        else:
            led = self.desks[worker].ledger
            allowed = led.try_spend(now, p, amount).allowed
            if allowed:
                peers = sum(b for (w, t), b in self.burn.items() if t == tenant and w != worker)
                state = led.state(now, p)
                self.last_lag[tenant] = peers - (0 if state is None else state.remote)
        if allowed:
            self.admitted[tenant] += amount
            self.burn[(worker, tenant)] = self.burn.get((worker, tenant), 0) + amount

    def run(self) -> dict[str, Any]:
        sc = self.sc
        end = self.start + int(sc.duration_s * NS_PER_S)
        events = sorted(
            [(self.start + int(f.at_s * NS_PER_S), "start", f) for f in sc.faults]
            + [
                (self.start + int(f.until_s * NS_PER_S), "end", f)
                for f in sc.faults
                if f.until_s is not None
            ],
            key=lambda e: e[0],
        )
        sync_ns = sc.fleet.sync_interval_ms * MS
        next_sync = self.start
        live = list(self.workers)
        while self.t < end:
            self.t += self.workload.step_ns
            while events and events[0][0] <= self.t:
                _, phase, f = events.pop(0)
                self.fault(f.kind, f.tenant, phase)
                live = [w for w in self.workers if w not in self.down]
            if self.strategy == "mesh":
                self._deliver()
                if self.t >= next_sync:
                    next_sync = self.t + sync_ns
                    for w in live:
                        self._send(w, self.desks[w].tick(self.ring))
            for a in self.workload.step(self.t):
                w = a.worker  # the load balancer sends a down worker's arrivals to a live one
                worker = w if w in live else live[self.workers.index(w) % len(live)]
                self.spend(worker, a.tenant, a.amount)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        sc = self.sc
        assert sc.quota is not None
        cap, n = sc.quota.cap, len(self.workers)
        ideal = {t: min(o, cap) for t, o in self.offered.items()}
        excess = {t: max(0, a - cap) for t, a in self.admitted.items()}
        jain, quiet_share = fairness_figures(sc, self.admitted, self.offered, ideal)
        bound = max(self.last_lag.values()) if self.strategy == "mesh" else (n - 1) * cap
        return {
            "admitted": sum(self.admitted.values()),
            "ideal": sum(ideal.values()),
            "max_excess": max(excess.values()),
            "mean_excess": round(sum(excess.values()) / len(excess), 3),
            "mean_excess_pct_of_rate": round(100 * sum(excess.values()) / len(excess) / cap, 3),
            "bound": bound,
            "within_bound": max(excess.values()) <= bound,
            "utilisation": round(sum(self.admitted.values()) / max(sum(ideal.values()), 1), 4),
            "fairness": jain,
            "quiet_share": quiet_share,
            "messages_per_worker_s": round(self.messages / n / sc.duration_s, 2),
            "round_trips_per_request": 0.0,  # admission is local; publishes are off-path
            "cap": cap,
            "publish_ms": sc.quota.publish_ms,
            "per_tenant": {
                t: {"admitted": self.admitted[t], "offered": self.offered[t]}
                for t in sorted(self.admitted)
            },
        }


def run_quota(sc: Scenario, seed: int, strategies: list[str] | None = None) -> dict[str, Any]:
    """Every quota strategy on the scenario, one seed; the simulator's result shape."""
    names = [s for s in (strategies or sc.strategies) if s in QUOTA_STRATEGIES]
    return run_result(sc, seed, {name: _Run(sc, seed, name).run() for name in names})


def run_result(sc: Scenario, seed: int, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The simulator's result shape around each strategy's figures, for a scenario that
    runs its own core (a spend quota, an in-flight cap)."""
    return {
        "scenario": sc.name,
        "seed": seed,
        "description": sc.description,
        "workers": sc.fleet.workers,
        "tenants": len(Workload(sc, seed, sc.worker_ids()).tenants),
        "duration_s": sc.duration_s,
        "strategies": runs,
    }


def fairness_figures(
    sc: Scenario, admitted: dict[str, int], offered: dict[str, int], ideal: dict[str, int]
) -> tuple[float, float]:
    """Jain's index over each tenant's admitted / ideal, and the quiet tenants' share of
    their ideal (the scenario's `quiet` ones, else the smallest by offered load)."""
    ratios = [admitted[t] / ideal[t] for t in ideal if ideal[t]]
    jain = sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios)) if ratios else 1.0
    smallest = min(sorted(offered), key=lambda t: offered[t])
    quiet = [t.name for t in sc.tenants if t.quiet] or [smallest]
    q_ideal = sum(ideal[t] for t in quiet)
    share = sum(min(admitted[t], ideal[t]) for t in quiet) / q_ideal if q_ideal else 1.0
    return round(jain, 4), round(share, 4)

"""Arrivals: the same for every strategy, drawn per step from the scenario and the seed.

Explicit tenants follow a pattern (steady, bursty, diurnal), or phases: each its own rate
through its own workers (traffic that moves from worker to worker, on/off bursts with idles
between). Groups spread a total rate over many tenants by a Zipf law. Each arrival goes to a
worker by the load balancer's weights (uneven under `lb_skew`), or to one of its phase's
workers. A request is one unit, or an amount drawn from the tenant's `amounts`. Byte tenants
send requests as chunks; some chunks are sent short, and the unused part is refunded after
admission.
"""

from __future__ import annotations

import math
import random
from bisect import bisect
from dataclasses import dataclass
from itertools import accumulate

from mesh.core.gcra import NS_PER_S
from mesh.core.policy import Unit
from sim.scenario import Phase, Policy, Scenario, TenantLoad

__all__ = ["Arrival", "Workload", "TenantInfo"]


@dataclass(frozen=True, slots=True)
class Arrival:
    worker: str
    tenant: str
    metric: str
    amount: int
    refund: int = 0  # a short send: given back after admission


@dataclass(frozen=True)
class TenantInfo:
    name: str
    policy: Policy
    quiet: bool
    load: TenantLoad | None  # None for group tenants


class Workload:
    def __init__(self, sc: Scenario, seed: int, workers: list[str], start_ns: int = 0) -> None:
        self.sc = sc
        self.start_ns = start_ns  # patterns and start_s count from here (after the warmup)
        self.rng = random.Random(f"workload/{seed}")
        self.workers = workers
        weights = [(i + 1) ** -sc.fleet.lb_skew for i in range(len(workers))]
        self._worker_cum = list(accumulate(weights))
        self.tenants: dict[str, TenantInfo] = {}
        for t in sc.tenants:
            self.tenants[t.name] = TenantInfo(t.name, t.policy or sc.policy, t.quiet, t)
        self._explicit = list(self.tenants.values())
        self._groups: list[tuple[list[str], list[float], float, str]] = []
        for g in sc.groups:
            names = [f"{g.prefix}{i:05d}" for i in range(g.count)]
            for n in names:
                self.tenants[n] = TenantInfo(n, sc.policy, False, None)
            cum = list(accumulate((i + 1) ** -g.zipf for i in range(g.count)))
            self._groups.append((names, cum, g.total_offered, sc.policy.metric))
        self._carry: dict[str, float] = {}
        # tenant -> (cumulative weights, amounts, mean amount): request sizes by weight
        self._amounts: dict[str, tuple[list[float], list[int], float]] = {}
        for t in sc.tenants:
            if t.amounts:
                weights = [w for _, w in t.amounts]
                mean = sum(a * w for a, w in t.amounts) / sum(weights)
                self._amounts[t.name] = (list(accumulate(weights)), [a for a, _ in t.amounts], mean)
        self.step_ns = int(sc.step_ms * 1_000_000)
        self._later: dict[int, list[Arrival]] = {}  # chunks of a transfer, one per step

    def worker_for(self) -> str:
        cum = self._worker_cum
        return self.workers[bisect(cum, self.rng.random() * cum[-1])]

    def phase(self, t: TenantLoad, now_s: float) -> Phase | None:
        """The phase of `t`'s load at `now_s` (None: no phases, or past the last one).
        Counted in whole microseconds, so a boundary falls on the step it names."""
        if not t.phases or now_s < t.start_s:
            return None
        at = round((now_s - t.start_s) * 1e6)
        if t.repeat:
            at %= sum(round(p.for_s * 1e6) for p in t.phases)
        for p in t.phases:
            length = round(p.for_s * 1e6)
            if at < length:
                return p
            at -= length
        return None

    def _rate(self, t: TenantLoad, now_s: float) -> float:
        if now_s < t.start_s:
            return 0.0
        if t.phases:
            p = self.phase(t, now_s)
            if p is None:
                return 0.0
            if p.offered is not None:
                return p.offered
        if t.pattern == "bursty":
            cycle_ms = t.burst_on_ms + t.burst_off_ms
            phase_ms = (now_s * 1000) % cycle_ms
            return t.offered * cycle_ms / t.burst_on_ms if phase_ms < t.burst_on_ms else 0.0
        if t.pattern == "diurnal":
            return t.offered * (1 + t.amplitude * math.sin(2 * math.pi * now_s / t.period_s))
        return t.offered

    def _count(self, key: str, expected: float) -> int:
        c = self._carry.get(key, 0.0) + expected * (0.5 + self.rng.random())
        n = int(c)
        self._carry[key] = c - n
        return n

    def step(self, t_ns: int) -> list[Arrival]:
        """Arrivals in (t - step, t], in the order they are offered."""
        out: list[Arrival] = self._later.pop(t_ns, [])
        now_s = (t_ns - self.start_ns) / NS_PER_S
        step_s = self.step_ns / NS_PER_S
        for info in self._explicit:
            load = info.load
            assert load is not None
            metric = info.policy.metric
            if info.policy.metric_unit is Unit.BYTES:
                n = self._count(info.name, self._rate(load, now_s) * step_s / load.request_bytes)
                for _ in range(n):
                    first, *rest = self._chunks(info.name, metric, load)
                    out.append(first)
                    for i, chunk in enumerate(rest, 1):  # the next chunk goes out a step later
                        self._later.setdefault(t_ns + i * self.step_ns, []).append(chunk)
            elif load.phases or load.amounts:
                out += self._shaped(info.name, metric, load, now_s, step_s)
            else:
                n = self._count(info.name, self._rate(load, now_s) * step_s)
                out += [Arrival(self.worker_for(), info.name, metric, 1) for _ in range(n)]
        for names, cum, total, metric in self._groups:
            n = self._count(f"group/{names[0]}", total * step_s)
            top = cum[-1]
            for _ in range(n):
                tenant = names[bisect(cum, self.rng.random() * top)]
                out.append(Arrival(self.worker_for(), tenant, metric, 1))
        return out

    def _shaped(
        self, tenant: str, metric: str, load: TenantLoad, now_s: float, step_s: float
    ) -> list[Arrival]:
        """A tenant with phases or amounts: its requests this step, each to one of its
        phase's workers and of a size drawn from its amounts."""
        sizes = self._amounts.get(tenant)
        mean = sizes[2] if sizes else 1.0
        n = self._count(tenant, self._rate(load, now_s) * step_s / mean)
        if not n:
            return []
        p = self.phase(load, now_s)
        only = p.workers if p is not None else ()
        out = []
        for _ in range(n):
            if len(only) == 1:
                worker = only[0]
            elif only:
                worker = only[int(self.rng.random() * len(only))]
            else:
                worker = self.worker_for()
            amount = 1
            if sizes:
                cum, values, _ = sizes
                amount = values[bisect(cum, self.rng.random() * cum[-1])]
            out.append(Arrival(worker, tenant, metric, amount))
        return out

    def _chunks(self, tenant: str, metric: str, load: TenantLoad) -> list[Arrival]:
        worker = self.worker_for()
        left = load.request_bytes
        chunks = []
        while left > 0:
            size = min(left, load.chunk_bytes)
            left -= size
            refund = 0
            if load.short_send and self.rng.random() < load.short_send:
                refund = int(size * self.rng.random())
            chunks.append(Arrival(worker, tenant, metric, size, refund))
        return chunks

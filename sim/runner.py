"""Runs a scenario: the same arrivals, network and faults for every strategy, one seed.

Each strategy gets a fresh network model and workload drawn from the same seed, so the
requests offered are identical; faults fire at the same instants on the same workers.

A tenant with `retry_ms` asks a denied request again, at the same worker (a client on its
connection), every `retry_ms` (on the step grid) until it is admitted or `give_up_ms` after
it was first offered. Its retries are what a strategy decides on later: the ideal judges
the request once, when first offered, and its admission counts when a retry gets it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mesh.core.config import MS
from mesh.core.gcra import NS_PER_S
from mesh.core.policy import RateKey
from mesh.core.ring import Ring
from sim.measure import Asked, Recorder
from sim.network import ScenarioNetwork
from sim.scenario import Fault, Scenario
from sim.strategies import Context, Strategy, make
from sim.workload import Arrival, Workload

__all__ = ["run", "run_strategy", "StrategyRun"]


@dataclass
class StrategyRun:
    name: str
    summary: dict[str, Any]
    series: dict[str, list[int]] = field(default_factory=dict)  # tenant -> per-100 ms units
    d_ns: int | None = None


def _fault_events(sc: Scenario, start_ns: int) -> list[tuple[int, int, str, Fault]]:
    events = []
    for i, f in enumerate(sc.faults):
        events.append((start_ns + int(f.at_s * NS_PER_S), i, "start", f))
        if f.until_s is not None:
            events.append((start_ns + int(f.until_s * NS_PER_S), i, "end", f))
    return sorted(events, key=lambda e: (e[0], e[1], e[2] != "end"))


class _Faults:
    """Applies a scenario's faults to one strategy and its network."""

    def __init__(
        self, sc: Scenario, strat: Strategy, net: ScenarioNetwork, rec: Recorder, canonical: Ring
    ) -> None:
        self.sc, self.strat, self.net, self.rec, self.ring = sc, strat, net, rec, canonical
        self.active: dict[int, frozenset[str]] = {}

    def victims(self, f: Fault) -> list[str]:
        if f.kind == "crash_owner":
            assert f.tenant is not None
            info = self.rec.tenants[f.tenant]
            return [self.ring.owner_of(RateKey(f.tenant, info.policy.metric, 1))]
        return list(f.members)

    def apply(self, phase: str, f: Fault, idx: int, now: int) -> None:
        s = self.strat
        if f.kind == "partition":
            if phase == "start":
                self.active[idx] = frozenset(f.members)
                self.net.partitions.append(self.active[idx])
            else:
                self.net.partitions.remove(self.active.pop(idx))
            s.partition_changed(now)
        elif f.kind == "governor_crash":
            (s.governor_crash if phase == "start" else s.governor_restart)(now)
        elif f.kind == "central_outage":
            (self.net.down.add if phase == "start" else self.net.down.discard)("central")
        elif f.kind in ("crash", "crash_owner"):
            for w in self.victims(f):
                if phase == "start" and w in s.live:
                    s.crash(w, now)
                elif phase == "end" and w not in s.live:
                    s.restart(w, now)
        elif f.kind == "restart":
            for w in f.members:
                if w not in s.live:
                    s.restart(w, now)
        elif f.kind == "join":
            for w in f.members:
                if w not in s.live:
                    s.join(w, now)
        elif f.kind == "leave":
            for w in f.members:
                if w in s.live and len(s.live) > 1:
                    s.leave(w, now)
        elif f.kind == "skew":
            for w in f.members:
                s.skew(w, int(f.offset_ms * MS) if phase == "start" else 0)
        elif f.kind == "policy_change" and phase == "start":
            assert f.tenant is not None and f.policy is not None
            self.rec.key(f.tenant, now).change_policy(f.policy, now)
            s.policy_changed(f.tenant, f.policy, now)


@dataclass
class _Ask:
    """A request of a retrying tenant, from its first ask until it ends."""

    arrival: Arrival
    first_ns: int
    retry_ns: int
    give_up_ns: int


class _Retries:
    """The requests waiting to be asked again, by the step they are due at."""

    def __init__(
        self, sc: Scenario, rec: Recorder, start_ns: int, step_ns: int, end_ns: int
    ) -> None:
        self.rec, self.start_ns, self.step_ns, self.end_ns = rec, start_ns, step_ns, end_ns
        self.policy: dict[str, tuple[int, int]] = {
            t.name: (int(t.retry_ms * MS), int(t.give_up_ms * MS))
            for t in sc.tenants
            if t.retry_ms is not None
        }
        self.due: dict[int, list[_Ask]] = {}
        self.asks: dict[int, _Ask] = {}  # id(arrival) -> ask, while it waits on a verdict

    def first(self, a: Arrival, now_ns: int) -> _Ask | None:
        p = self.policy.get(a.tenant)
        return None if p is None else _Ask(a, now_ns, p[0], now_ns + p[1])

    def denied(self, ask: _Ask, now_ns: int) -> None:
        """Ask again after retry_ns, on the step grid; or it ends, unadmitted."""
        at = now_ns + ask.retry_ns
        at += -(at - self.start_ns) % self.step_ns  # the step it is next asked at
        if at > ask.give_up_ns or at > self.end_ns:
            self.ended(ask, None, min(ask.give_up_ns, self.end_ns))
        else:
            self.due.setdefault(at, []).append(ask)

    def ended(self, ask: _Ask, admitted_ns: int | None, now_ns: int) -> None:
        if admitted_ns is not None and admitted_ns == ask.first_ns:
            return  # admitted on its first ask: never asked again
        a = ask.arrival
        self.rec.asked(a.tenant, Asked(a.amount, ask.first_ns, now_ns, admitted_ns, ask.retry_ns))

    def drain(self) -> None:
        """The run ended: every ask still open ends unadmitted."""
        for at in sorted(self.due):
            for ask in self.due.pop(at):
                self.ended(ask, None, self.end_ns)
        for ask in list(self.asks.values()):
            self.ended(ask, None, self.end_ns)
        self.asks.clear()


def run_strategy(
    sc: Scenario,
    seed: int,
    name: str,
    *,
    d_ns: int | None = None,
    keep_series: int = 6,
    on_step: Callable[[int, int], None] | None = None,
) -> StrategyRun:
    """One strategy over the scenario. `on_step(step, steps)` is called about a hundred
    times over the run (and at its end): progress for a caller that shows it."""
    workers = sc.worker_ids()
    start = int(sc.warmup_s * NS_PER_S)
    net = ScenarioNetwork(sc.network, random.Random(f"network/{seed}"))
    workload = Workload(sc, seed, workers, start)
    ctx = Context(sc, seed, workers, workload.tenants, net)
    strat = make(name, ctx)
    end = start + int(sc.duration_s * NS_PER_S)
    rec = Recorder(workload.tenants, start, workload.step_ns)
    retries = _Retries(sc, rec, start, workload.step_ns, end)
    faults = _Faults(sc, strat, net, rec, Ring(workers, 1))
    events = _fault_events(sc, start)
    index = {w: i for i, w in enumerate(workers)}
    touched: set[str] = set()
    waiting: dict[int, Arrival] = {}  # id -> arrival: those admit() left waiting

    def resolved(a: Arrival, allowed: bool, t_ns: int) -> None:
        del waiting[id(a)]  # a KeyError here: resolved twice, or never left waiting
        ask = retries.asks.pop(id(a), None)
        if allowed:
            if a.refund:
                strat.refund(a, t_ns)
            rec.admit(a, t_ns)
            touched.add(a.tenant)
            if ask is not None:
                retries.ended(ask, t_ns, t_ns)
        elif ask is not None:
            retries.denied(ask, t_ns)

    def to_live(a: Arrival) -> Arrival:
        live = strat.live
        if a.worker in live:
            return a
        # the load balancer sends it to a live worker
        w = live[index[a.worker] % len(live)]
        return Arrival(w, a.tenant, a.metric, a.amount, a.refund)

    def asked(a: Arrival, ask: _Ask | None, t_ns: int) -> None:
        """One ask of `a` (its first when `ask` is None), decided now or left waiting."""
        first = ask is None
        if first:
            ask = retries.first(a, t_ns)
        allowed = strat.admit(a, t_ns)
        if allowed is None:
            waiting[id(a)] = a
            if first:
                rec.offer(a, t_ns)
            if ask is not None:
                retries.asks[id(a)] = ask
            return
        if allowed and a.refund:
            strat.refund(a, t_ns)
        if first:
            rec.record(a, allowed, t_ns)
        elif allowed:
            rec.admit(a, t_ns)
        if ask is None:
            return
        if not first:
            rec.attempts += 1
        if allowed:
            retries.ended(ask, t_ns, t_ns)
        else:
            if first:
                rec.verdict_said(a, strat.wait_helps(a, t_ns))
            retries.denied(ask, t_ns)

    strat.resolved = resolved
    strat.advance(start)
    t, step_ns, step = start, workload.step_ns, 0
    steps = -(-(end - start) // step_ns)
    every = max(1, steps // 100)
    while t < end:
        t += step_ns
        step += 1
        if on_step is not None and step % every == 0:
            on_step(step, steps)
        while events and events[0][0] <= t:
            when, idx, phase, f = events.pop(0)
            strat.advance(when)
            faults.apply(phase, f, idx, when)
        strat.advance(t)
        for ask in retries.due.pop(t, ()):
            ask.arrival = to_live(ask.arrival)
            asked(ask.arrival, ask, t)
            touched.add(ask.arrival.tenant)
        for a in workload.step(t):
            a = to_live(a)
            asked(a, None, t)
            touched.add(a.tenant)
        rec.sample(step, touched)
        touched.clear()
    retries.drain()
    rec.finish(step, end)
    measured = strat.measured_d_ns()
    fl = sc.fleet
    nominal = 2 * fl.sync_interval_ms * MS + 2 * net.nominal_delay_ns()
    d = measured or d_ns or nominal
    summary = rec.summary(d_ns=d, n_default=len(workers))
    summary["messages_per_worker_s"] = round(
        strat.message_count() / len(workers) / sc.duration_s, 2
    )
    summary["round_trips_per_request"] = round(strat.round_trips / max(rec.requests, 1), 4)
    if strat.judged_over_intervals:
        summary.update(rec.envelope())
    summary.update(strat.report())
    summary["d_ms"] = round(d / MS, 3)
    summary["requests"] = rec.requests
    if waiting:
        summary["waiting_at_end"] = len(waiting)  # offered, not yet decided: not admitted
    focus = [k for k in rec.keys.values() if rec.tenants[k.tenant].load is not None]
    focus = focus or sorted(rec.keys.values(), key=lambda k: -k.offered)
    series = {k.tenant: k.series for k in focus[:keep_series]}
    return StrategyRun(name, summary, series, measured)


Progress = Callable[[int, int, str], None]  # done, total, what runs now (mesh.cli._progress)


def _steps(
    progress: Progress | None, i: int, n: int, name: str
) -> Callable[[int, int], None] | None:
    """The i-th of n strategies' steps as a share of the whole run, in percent."""
    if progress is None:
        return None
    p = progress

    def on_step(step: int, steps: int) -> None:
        p(i * 100 + step * 100 // max(steps, 1), n * 100, name)

    return on_step


def run(
    sc: Scenario,
    seed: int,
    strategies: list[str] | None = None,
    progress: Progress | None = None,
) -> tuple[dict[str, Any], list[StrategyRun]]:
    """Every strategy on the scenario; the mesh first, so its measured d sets the bound.
    `progress(done, total, strategy)` hears the simulated steps as they run."""
    if sc.quota is not None:  # a spend-quota scenario: its own run over the quota core
        from sim.quota import run_quota

        return run_quota(sc, seed, strategies), []
    if sc.concurrency is not None:  # an in-flight cap: its own run over the slot core
        from sim.concurrency import run_concurrency

        return run_concurrency(sc, seed, strategies), []
    names = list(strategies or sc.strategies)
    if "mesh" in names:
        names.remove("mesh")
        names.insert(0, "mesh")
    wall0 = time.perf_counter()
    runs: list[StrategyRun] = []
    d_ns: int | None = None
    per_strategy: dict[str, float] = {}
    for i, name in enumerate(names):
        t0 = time.perf_counter()
        r = run_strategy(sc, seed, name, d_ns=d_ns, on_step=_steps(progress, i, len(names), name))
        per_strategy[name] = round(time.perf_counter() - t0, 3)
        if name == "mesh":
            d_ns = r.d_ns
        runs.append(r)
    wall = time.perf_counter() - wall0
    simulated = (sc.warmup_s + sc.duration_s) * len(names)
    result: dict[str, Any] = {
        "scenario": sc.name,
        "seed": seed,
        "description": sc.description,
        "workers": sc.fleet.workers,
        "tenants": len(Workload(sc, seed, sc.worker_ids()).tenants),
        "duration_s": sc.duration_s,
        "strategies": {r.name: r.summary for r in runs},
        "timing": {
            "wall_s": round(wall, 3),
            "simulated_s": simulated,
            "speedup": round(simulated / wall, 2) if wall else None,
            "strategies_s": per_strategy,  # wall seconds per strategy, for comparing them
        },
    }
    return result, runs

"""The adaptive limit as a controller: driven against a simulated downstream on the manual clock.

The downstream is the benchmark's model (``governor/bench/_downstream.py``) stepped in whole
milliseconds: a call arriving while ``capacity`` calls are in flight is refused after
``reject_ms`` and occupies a slot meanwhile, so excess load crowds out service. Every run is
deterministic: no threads, no real time.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

import pytest

from governor.engine import (
    ROOT_ID,
    AdaptiveConfig,
    Engine,
    Event,
    Granted,
    ManualClock,
)
from governor.engine._events import LimitAdjusted
from governor.testing.checks import canonical

CFG = AdaptiveConfig(
    initial_limit=20,
    min_limit=1,
    max_limit=30,
    target_p95_ms=100,
    max_overload_permille=100,
    min_samples=10,
    interval_ms=250,
)


@dataclass
class Call:
    lease_id: int
    started_ms: int
    done_ms: int
    refused: bool


@dataclass
class Sim:
    """``workers`` loop acquire -> call -> release; ``capacity`` can be changed between runs."""

    workers: int = 30
    capacity: int = 20
    service_ms: int = 20
    reject_ms: int = 5
    config: AdaptiveConfig = CFG
    clock: ManualClock = field(default_factory=lambda: ManualClock(1_000))
    events: list[Event] = field(default_factory=list)
    served: int = 0
    refused: int = 0

    def __post_init__(self) -> None:
        self.engine = Engine(self.clock, self.events.append)
        self.engine.set_adaptive("db", self.config)
        self.sid, _ = self.engine.open_session(ROOT_ID, 10**9, hashlib.sha256(b"w").hexdigest())
        self.calls: list[Call] = []

    @property
    def limit(self) -> int:
        return self.engine.state.nodes[ROOT_ID].limits["db"]

    def run(self, ms: int) -> list[int]:
        """Advance ``ms`` milliseconds; returns the limit at the end of each millisecond."""
        trace = []
        for _ in range(ms):
            now = self.clock.now_ms()
            for call in [c for c in self.calls if c.done_ms <= now]:
                self.calls.remove(call)
                self.engine.release(
                    self.sid,
                    call.lease_id,
                    latency_ms=now - call.started_ms,
                    overloaded=call.refused,
                )
                self.served += not call.refused
                self.refused += call.refused
            self.engine.tick()
            while len(self.calls) < self.workers:
                lease = self.engine.acquire(self.sid, ROOT_ID, "db", wait=False)
                if not isinstance(lease, Granted):
                    break
                refused = len(self.calls) >= self.capacity
                took = self.reject_ms if refused else self.service_ms
                self.calls.append(Call(lease.lease_id, now, now + took, refused))
            self.clock.advance(1)
            trace.append(self.limit)
        return trace

    def counts(self, ms: int) -> tuple[int, int]:
        """(served, refused) over the next ``ms`` milliseconds."""
        served, refused = self.served, self.refused
        self.run(ms)
        return self.served - served, self.refused - refused


@pytest.mark.slow
def test_the_limit_falls_under_overload_to_near_the_true_capacity_and_holds_there() -> None:
    sim = Sim()
    sim.run(3_000)
    before = sim.run(2_000)
    assert 20 * 7 // 10 <= min(before) and max(before) <= 20 + 1  # the sawtooth around 20
    n = len(sim.events)
    sim.capacity = 5
    falling = sim.run(1_000)
    # The window before the drop still probes (+1 to 19). Then one cut per interval, each on what
    # was served but never below x0.5: 19 -> 10 -> 6 -> 5. The seed's x0.7 alone would take
    # 19 -> 13 -> 9 -> 6 -> 4: an interval of sheds more, and it ends below the capacity.
    limits = [e.limit for e in sim.events[n:] if isinstance(e, LimitAdjusted)]
    assert limits[:4] == [19, 10, 6, 5]
    assert min(falling) >= 5 and falling.index(5) <= 3 * 250
    steady = sim.run(3_000)
    assert set(steady) <= {5, 6}  # probes one above, cuts back to the capacity, not below it
    served, refused = sim.counts(3_000)
    assert served >= 0.95 * 5 * 3_000 / 20  # at least 95 % of what capacity 5 can serve
    assert refused <= 0.5 * served


@pytest.mark.slow
def test_it_probes_upward_and_recovers_when_capacity_returns() -> None:
    sim = Sim()
    sim.run(1_000)
    sim.capacity = 5
    sim.run(3_000)
    assert sim.limit <= 6
    sim.capacity = 20
    rising = sim.run(6_000)
    # +1 per 250 ms interval while nothing is refused: back near 20 within (20 - 6) intervals
    assert max(rising[: (20 - 6) * 250 + 500]) >= 20
    steps = [b - a for a, b in zip(rising, rising[1:], strict=False)]
    assert max(steps) == 1  # upward only one at a time
    served, _ = sim.counts(3_000)
    assert served >= 0.85 * 20 * 3_000 / 20


@pytest.mark.slow
def test_the_limit_never_leaves_min_and_max_whatever_the_reports() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        cfg = AdaptiveConfig(
            initial_limit=rng.randint(2, 6),
            min_limit=2,
            max_limit=rng.randint(6, 9),
            target_p95_ms=50,
            max_overload_permille=rng.choice([0, 100, 500]),
            min_samples=rng.randint(1, 4),
            interval_ms=100,
        )
        clock = ManualClock(0)
        events: list[Event] = []
        engine = Engine(clock, events.append)
        engine.set_adaptive("db", cfg)
        sid, _ = engine.open_session(ROOT_ID, 10**9, hashlib.sha256(b"%d" % seed).hexdigest())
        held: list[int] = []
        for _ in range(3_000):
            if held and rng.random() < 0.5:
                lease_id = held.pop(rng.randrange(len(held)))
                engine.release(
                    sid,
                    lease_id,
                    latency_ms=rng.choice([1, 10, 500]),
                    overloaded=rng.random() < 0.4,
                )
            else:
                lease = engine.acquire(sid, ROOT_ID, "db", wait=False)
                if isinstance(lease, Granted):
                    held.append(lease.lease_id)
            clock.advance(rng.randint(0, 30))
            engine.tick()
        limits = [e.limit for e in events if isinstance(e, LimitAdjusted)]
        assert len(limits) > 20
        assert all(cfg.min_limit <= x <= cfg.max_limit for x in limits), (seed, limits)


def _window_world(limit: int) -> tuple[Engine, ManualClock, int]:
    clock = ManualClock(0)
    engine = Engine(clock, lambda e: None)
    cfg = AdaptiveConfig(
        initial_limit=limit,
        min_limit=1,
        max_limit=40,
        target_p95_ms=100,
        min_samples=4,
        interval_ms=100,
    )
    engine.set_adaptive("db", cfg)
    sid, _ = engine.open_session(ROOT_ID, 10**9, hashlib.sha256(b"x").hexdigest())
    return engine, clock, sid


def _window(engine: Engine, clock: ManualClock, sid: int, ok: int, bad: int) -> int:
    """One 100 ms window: ``ok`` leases held throughout and served; ``bad`` at a time refused
    after 10 ms, nine times over. Returns the limit after it."""
    ok_leases = [engine.acquire(sid, ROOT_ID, "db", wait=False) for _ in range(ok)]
    for _ in range(9):
        refused = [engine.acquire(sid, ROOT_ID, "db", wait=False) for _ in range(bad)]
        clock.advance(10)
        for lease in refused:
            assert isinstance(lease, Granted)
            engine.release(sid, lease.lease_id, latency_ms=10, overloaded=True)
    clock.advance(10)
    for lease in ok_leases:
        assert isinstance(lease, Granted)
        engine.release(sid, lease.lease_id, latency_ms=100)
    engine.tick()
    return engine.state.nodes[ROOT_ID].limits["db"]


def test_an_overload_cut_lands_on_the_served_concurrency_between_x0_5_and_x0_7() -> None:
    cases = [  # (limit, served, refused at a time) -> new limit
        ((20, 12, 2), 12),  # cut to what was served
        ((20, 9, 2), 10),  # served 9, but a cut never goes below x0.5
        ((10, 9, 1), 7),  # served 9, but a cut is at least x0.7
        ((6, 5, 1), 5),  # x0.7 rounded down would cut 6 to 4, below the 5 served
        ((6, 4, 2), 4),
        ((2, 1, 1), 1),  # at least one lower
        ((20, 19, 0), 21),  # no overload: +1
    ]
    for (limit, ok, bad), want in cases:
        engine, clock, sid = _window_world(limit)
        assert _window(engine, clock, sid, ok, bad) == want, (limit, ok, bad)


def test_reports_of_leases_granted_under_the_previous_limit_do_not_vote() -> None:
    engine, clock, sid = _window_world(10)
    old = [engine.acquire(sid, ROOT_ID, "db", wait=False) for _ in range(4)]
    assert _window(engine, clock, sid, ok=4, bad=0) == 11
    for lease in old:  # granted before the adjustment: overloaded, but says nothing about 11
        assert isinstance(lease, Granted)
        engine.release(sid, lease.lease_id, latency_ms=5, overloaded=True)
    assert engine.state.adaptive["db"].samples == []
    assert _window(engine, clock, sid, ok=4, bad=0) == 12


def test_the_window_survives_a_snapshot_and_an_old_snapshot_still_loads() -> None:
    sim = Sim(workers=10, capacity=5)
    sim.run(1_130)  # mid-window, leases held
    snap = sim.engine.snapshot()
    restored = Engine.restore(snap, [], ManualClock(sim.clock.now_ms()), lambda e: None)
    assert canonical(restored) == canonical(sim.engine)
    replayed = Engine.restore(None, sim.events, ManualClock(sim.clock.now_ms()), lambda e: None)
    assert canonical(replayed) == canonical(sim.engine)
    for entry in snap["adaptive"]:
        del entry[4:]  # as written before the served-concurrency window existed
    old = Engine.restore(snap, [], ManualClock(sim.clock.now_ms()), lambda e: None)
    window = old.state.adaptive["db"]
    assert (window.ok_ms, window.busy_ms, window.busy_since_ms) == (0, 0, window.last_adjust_ms)

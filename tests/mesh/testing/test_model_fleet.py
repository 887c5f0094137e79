"""`global` mode: the in-memory fleet against an independent model, under schedules chosen to
break the envelope.

Each schedule (one seed) runs 3-4 real `Member`s on the virtual clock of `MemoryFleet` and
mixes what friendly workloads never do: traffic that moves between workers and comes back
after idles below and past views_idle_ms and the snapshot TTL, on/off bursts, amounts from 1
to above b and B, refunds (short sends), generation changes, members crashing and
restarting, joining and leaving (owner changes mid-flight). Every admission is recorded at
its instant and held against `mesh.testing.reference`, which shares no code with the core:

* envelope: per generation (each is its own RateKey), replaying admissions and refunds
  through a token bucket of rate R and burst B + N*b + R*d never goes below zero; that is
  admitted(t0, t1) <= R*(t1 - t0) + B + N*b + R*d over every interval (refunds give back);
* no starvation: a request of amount <= b, retried every millisecond, is admitted within
  STARVE_MS while the reference bucket (R, B) fed the fleet's admissions holds it and 2*R*d
  more all along (the reference charged too with what owners may escrow for a member's
  floor each time it pauses),
  unless its verdict discloses a degraded state or a member or the ring changed meanwhile
  (the reference is held empty for B/R then: an owner opening a key within B/R of a ring
  change starts it exhausted, seed 004);
* amounts above b are `too_large` at once, and none at or below b is.

SCHEDULES seeds run per CI run; `RATEMESH_MODEL_SEED=<seed>` replays one.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field

from mesh.core.config import CoreConfig
from mesh.core.gcra import NS_PER_S
from mesh.core.policy import PolicyCache
from mesh.core.verdict import Reason
from mesh.testing.fleet import MemoryFleet
from mesh.testing.reference import TokenBucket, replay
from tests.mesh._helpers import MS, policy

SCHEDULES = int(os.environ.get("RATEMESH_FLEET_SCHEDULES", "320"))
T, M = "t", "read_iops"
# (R, B, b): the users' reports (50/10/2 and 400/80/16) and wider ones
LIMITS = [
    (50, 10, 2),
    (400, 80, 16),
    (2000, 200, 40),
    (100, 100, 20),
    (1000, 60, 12),
    (50, 4, 1),
    (80, 10, 3),
]
STARVE_MS = 60  # a served request's longest wait while the reference held it (d is ~13 ms)
CHANGE_QUIET_MS = 200  # after a member or ring change, waits are not judged for B/R + this
QUEUE_MAX = 32  # requests one worker keeps waiting; more are abandoned (not judged)
# An owner escrows the floor of a member gone silent (at most R / N a second) from 30 ms
# after its last report until its idle mark arrives (200 ms, a TTL later at most), charged
# to the key like usage (docs/partitions.md): the starvation reference is charged as much.
ESCROW_AFTER_MS = 30
ESCROW_SPAN_MS = 220


@dataclass
class Request:
    amount: int
    since_ns: int = -1  # when it reached the head of its worker's queue (-1: not yet)
    low: float = math.inf  # the reference bucket's lowest level since then
    judged: bool = True  # False once a degraded verdict or a change excuses its wait


@dataclass
class Schedule:
    seed: int
    rate: int
    burst: int
    b: int
    members: list[str]
    idle_ms: int
    history: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # gen -> events
    failures: list[str] = field(default_factory=list)
    admitted: int = 0
    gen: int = 1
    crashed: set[str] = field(default_factory=set)
    quiet_until: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        cfg = CoreConfig(views_idle_ms=self.idle_ms)
        self.fleet = MemoryFleet(
            self.members,
            PolicyCache([policy(T, rate=self.rate, burst=self.burst, b=self.b)]),
            seed=self.seed,
            config=cfg,
        )
        self.fleet.run_until(NS_PER_S // 5)  # owners past their conservative start
        self.ref = TokenBucket(self.rate, self.burst, self.fleet.now_ns)
        self.queues: dict[str, list[Request]] = {m: [] for m in self.members}
        self.refunds: list[tuple[int, str, int]] = []  # (at, worker, units)
        self.n_max = len(self.members)
        self.d_ns = 0
        self.asked_at: dict[str, int] = {}  # member -> when it last asked (its last report)
        # The owner's bucket trails the fleet's admissions by up to R*d: a wait is judged
        # only while the reference holds that much more than the request.
        self.slop = 1 + 2 * self.rate * self.fleet.propagation_delay_ns() / NS_PER_S
        self._changed()  # an owner's first keys start exhausted for B/R (seed 004)

    # -- the workload -----------------------------------------------------------------

    def offer(self, worker: str, amount: int) -> None:
        if worker in self.crashed:
            return
        if amount > self.b:
            v = self.fleet.try_admit(worker, T, M, amount)
            if v.allowed or v.reason is not Reason.TOO_LARGE:
                self.failures.append(f"{amount} > b={self.b} on {worker} answered {v}")
            return
        q = self.queues[worker]
        if len(q) < QUEUE_MAX:
            q.append(Request(amount))

    def step(self, step_ns: int = MS) -> None:
        f = self.fleet
        f.run_until(f.now_ns + step_ns)
        now = f.now_ns
        if now <= self.empty_until:
            self._empty(now)
        self._escrow(now)
        level = float(self.ref.tokens(now))
        for w, q in self.queues.items():
            if w in self.crashed:
                q.clear()
                continue
            if q:
                self.asked_at[w] = now
            while q:
                r = q[0]
                if r.since_ns < 0:
                    r.since_ns = now
                r.low = min(r.low, level)
                v = f.try_admit(w, T, M, r.amount)
                if v.allowed:
                    q.pop(0)
                    self._admitted(w, r.amount)
                    level = float(self.ref.tokens(now))
                    continue
                if v.reason is Reason.TOO_LARGE:
                    self.failures.append(f"{r.amount} <= b={self.b} on {w} answered {v}")
                    q.pop(0)
                    continue
                if v.suspended is not None or now < self.quiet_until:
                    r.judged = False
                waited = now - r.since_ns
                if r.judged and waited > STARVE_MS * MS and r.low >= r.amount + self.slop:
                    self.failures.append(
                        f"starved: {r.amount} on {w} waited {waited // MS} ms at t={now} "
                        f"while the reference bucket held >= {r.low:.2f}"
                    )
                    r.judged = False
                break
        due = [x for x in self.refunds if x[0] <= now]
        if due:
            self.refunds = [x for x in self.refunds if x[0] > now]
            for _, w, units in due:
                if w in self.crashed or w not in f.members:
                    continue
                f.members[w].admission.refund(T, M, units)
                self.history.setdefault(self.gen, []).append((now, -units))
                self.ref.give(now, units)

    def _escrow(self, now: int) -> None:
        """A member that paused past ESCROW_AFTER_MS may have its floor escrowed by the
        owner (at most R / N a second for ESCROW_SPAN_MS): charged to the starvation
        reference once per pause, as the owner charges it to the key."""
        for m, at in self.asked_at.items():
            if at >= 0 and now - at >= ESCROW_AFTER_MS * MS:
                self.asked_at[m] = -1  # charged for this pause
                units = self.rate / len(self.members) * ESCROW_SPAN_MS / 1000
                self.ref.force(now, math.ceil(units))

    def _admitted(self, w: str, amount: int) -> None:
        now = self.fleet.now_ns
        self.admitted += amount
        self.history.setdefault(self.gen, []).append((now, amount))
        self.ref.force(now, amount)
        if self.rng.random() < 0.1:  # a short send: part of it comes back a little later
            back = self.rng.randint(1, amount)
            self.refunds.append((now + self.rng.randint(0, 20) * MS, w, back))

    def serve(self, workers: list[str], per_s: float, ms: int, amounts: list[int]) -> None:
        carry = 0.0
        for _ in range(ms):
            carry += per_s / 1000
            while carry >= 1:
                carry -= 1
                self.offer(self.rng.choice(workers), self.rng.choice(amounts))
            self.step()

    def idle(self, ms: int) -> None:
        for q in self.queues.values():
            q.clear()
        end = self.fleet.now_ns + ms * MS
        while self.fleet.now_ns < end:
            self.step(min(10 * MS, end - self.fleet.now_ns))

    # -- changes ------------------------------------------------------------------------

    def _changed(self) -> None:
        """A member or the ring changed: an owner may open the key afresh, exhausted and
        refilling at R (seed 004, disclosed), so the starvation reference starts empty."""
        now = self.fleet.now_ns
        self.empty_until = now + self.burst * NS_PER_S // self.rate
        self.quiet_until = self.empty_until + CHANGE_QUIET_MS * MS
        self._empty(now)

    def _empty(self, now: int) -> None:
        """Keys an owner opens within B/R of a change start exhausted: so does the reference."""
        level = self.ref.tokens(now)
        if level > 0:
            self.ref.force(now, math.ceil(level))
        for q in self.queues.values():
            for r in q:
                r.judged = False

    def crash(self, w: str) -> None:
        if len(self.fleet.members) <= 2 or w in self.crashed:
            return
        self.fleet.crash(w)
        self.crashed.add(w)
        self._changed()

    def restart(self, w: str) -> None:
        if w not in self.crashed:
            return
        self.fleet.restart(w)
        self.crashed.discard(w)
        self._changed()

    def new_generation(self) -> None:
        """A push of the same limit as a new generation: a new RateKey, a new bucket."""
        self.gen += 1
        self.fleet.policies.put(policy(T, rate=self.rate, burst=self.burst, b=self.b, gen=self.gen))
        self.ref = TokenBucket(self.rate, self.burst, self.fleet.now_ns)
        self._changed()

    # -- the verdict --------------------------------------------------------------------

    def check(self) -> list[str]:
        d_ns = max(self.fleet.propagation_delay_ns(), self.d_ns)
        slack = self.n_max * self.b + self.rate * d_ns / NS_PER_S
        out = list(self.failures)
        for gen, events in sorted(self.history.items()):
            low = replay(events, self.rate, self.burst + math.ceil(slack), events[0][0])
            if low < 0:
                out.append(
                    f"generation {gen}: over the envelope by {float(-low):.2f} units "
                    f"(N*b + R*d = {slack:.2f}, d = {d_ns / MS:.1f} ms)"
                )
        return out


def run_schedule(seed: int) -> Schedule:
    rng = random.Random(seed ^ 0x5EED)
    rate, burst, b = rng.choice(LIMITS)
    n = rng.choice([3, 3, 4])
    members = [f"w{i}" for i in range(n)]
    s = Schedule(seed, rate, burst, b, members, idle_ms=rng.choice([400, 1500]))
    share = -(-b // n)
    amount_sets = [[1], [share], [share + 1], [b], [b + 1], [1, b], [burst + 1, 1], [1, 2, share]]
    for _ in range(rng.randint(4, 9)):
        r = rng.random()
        live = [m for m in members if m not in s.crashed]
        if r < 0.55:
            one = rng.random() < 0.7  # traffic through one worker (then another, then back)
            workers = [rng.choice(live)] if one else live
            per_s = rate * rng.choice([0.5, 1, 3, 4])
            s.serve(workers, per_s, rng.choice([50, 200, 600]), rng.choice(amount_sets))
        elif r < 0.78:
            # idles of every length: a tick, the TTL, the lease, past views_idle_ms
            s.idle(rng.choice([3, 25, 60, 300, s.idle_ms + 100, s.idle_ms * 2 + 50]))
        elif r < 0.86:
            s.crash(rng.choice(live))
        elif r < 0.92:
            for m in sorted(s.crashed):
                s.restart(m)
        else:
            s.new_generation()
    return s


def test_random_fleet_schedules() -> None:
    only = os.environ.get("RATEMESH_MODEL_SEED")
    seeds = [int(only)] if only else range(SCHEDULES)
    bad = []
    for seed in seeds:
        s = run_schedule(seed)
        problems = s.check()
        if problems:
            bad.append(
                f"seed {seed} (R={s.rate} B={s.burst} b={s.b} N={len(s.members)}): {problems[:3]}"
            )
    assert not bad, f"{len(bad)} of {len(list(seeds))} schedules failed:\n" + "\n".join(bad[:10])


# -- the patterns users found ------------------------------------------------------------


def test_traffic_that_returns_after_an_idle_is_metered_again() -> None:
    """R=50, B=10, b=2 on three members: 180 offers/s through a, then b, then a again, with
    an idle past views_idle_ms before the return. The returning view used to number its
    reports from 1; the owner took them for duplicates and never applied them."""
    s = Schedule(1, 50, 10, 2, ["a", "b", "c"], idle_ms=400)
    s.serve(["a"], 180, 1000, [1])
    s.serve(["b"], 180, 1000, [1])
    s.idle(900)  # past views_idle_ms: a's view is forgotten
    before = s.admitted
    s.serve(["a"], 180, 2000, [1])
    assert s.admitted - before <= 50 * 2 + 10 + 3 * 2 + 5, s.admitted - before
    dups = sum(m.owner.duplicates for m in s.fleet.members.values())
    assert dups == 0, dups
    assert s.check() == []


def test_amounts_of_b_from_two_workers_are_served() -> None:
    """b=2, amount 2 from two members, each asking every 40 ms (100 units/s against 50/s):
    each member's even cap was b/N = 1, so nothing ever fit (0 in 6 s), and every verdict
    said rate_limited with a retry."""
    s = Schedule(2, 50, 10, 2, ["a", "b", "c"], idle_ms=1500)
    start, got = s.fleet.now_ns, 0
    for ms in range(6000):
        w = "a" if ms % 40 == 0 else "b" if ms % 40 == 20 else None
        if w is not None and s.fleet.try_admit(w, T, M, 2).allowed:
            got += 2
            s.history.setdefault(1, []).append((s.fleet.now_ns, 2))
        s.fleet.run_until(start + (ms + 1) * MS)
    assert got >= 0.8 * (50 * 6 + 10), got
    assert s.check() == []


def test_an_amount_above_the_even_share_passes_within_a_round_trip() -> None:
    """R=400, B=80, b=16 on three members. On a cold key a view starts from ceil(b/N) = 6:
    a first ask of 7 is denied with a short retry_after_ms, and the retry after one round
    trip to the owner passes (the view's next snapshot lets it hold what it was denied)."""
    s = Schedule(3, 400, 80, 16, ["a", "b", "c"], idle_ms=1500)
    for k in range(19):
        s.fleet.policies.put(policy(f"cold{k}", rate=400, burst=80, b=16))
    for k in range(19):
        adm = s.fleet.members["a"].admission
        first = adm.try_admit_detailed(f"cold{k}", M, 7)
        if not first.allowed:
            assert first.reason is Reason.RATE_LIMITED and first.retry_after_ms is not None
            assert first.retry_after_ms <= 20, first
        s.fleet.run_until(s.fleet.now_ns + s.fleet.propagation_delay_ns())
        assert first.allowed or s.fleet.try_admit("a", f"cold{k}", M, 7).allowed, k


def test_amounts_up_to_b_on_a_warm_key_pass_and_above_b_are_too_large() -> None:
    """The same limit warm: 16 (= b) passes; 17 was denied rate_limited with a 3 ms retry
    forever; it is too_large now, retry_after_ms null."""
    s = Schedule(4, 400, 80, 16, ["a", "b", "c"], idle_ms=1500)
    s.serve(["a", "b", "c"], 100, 200, [1])
    adm = s.fleet.members["b"].admission
    passed = 0
    for _ in range(19):
        passed += adm.try_admit(T, M, 16).allowed
        s.fleet.run_until(s.fleet.now_ns + 50 * MS)
    assert passed >= 15, passed
    v = adm.try_admit_detailed(T, M, 17)
    assert (v.allowed, v.reason, v.retry_after_ms) == (False, Reason.TOO_LARGE, None)


def test_each_new_larger_amount_up_to_b_passes_at_its_first_ask_on_a_warm_key() -> None:
    """R=400, B=80, b=16 on three members, the key warm and its bucket near full, unit asks
    trickling through all three. Asks of 6, 8, ..., 16 on member a, each size once: each is
    above what the view holds (its even cap, b/3, or the last size it was denied), so a view
    that waited for its next snapshot's cap denied every one at its first ask, where an
    exact bucket served them all. Now each is taken at once when the owner's last snapshot
    holds it for all three members at once, and the view holds at most b unreflected (the
    envelope's N*b); one may still meet the view with too much in flight."""
    s = Schedule(5, 400, 80, 16, ["a", "b", "c"], idle_ms=1500)
    s.serve(["a", "b", "c"], 60, 200, [1])
    adm = s.fleet.members["a"].admission
    passed = []
    for amount in (6, 8, 10, 12, 14, 16):
        s.serve(["a", "b", "c"], 60, 30, [1])
        passed.append(adm.try_admit(T, M, amount).allowed)
        s.serve(["a", "b", "c"], 60, 30, [1])
    assert sum(passed) >= 5, passed
    assert s.check() == []


def test_an_amount_above_b_is_too_large_with_no_retry() -> None:
    s = Schedule(4, 400, 80, 16, ["a", "b", "c"], idle_ms=1500)
    s.serve(["a"], 100, 50, [1])
    m = s.fleet.members["a"].admission
    v = m.try_admit_detailed(T, M, 17)
    assert (v.allowed, v.reason, v.retry_after_ms) == (False, Reason.TOO_LARGE, None)

"""Adversarial schedules for the global mode, one per seed, and the judgement of what a fleet
answered to one.

A schedule is a list of offers (when, through which member, how many units, whether the
caller retries a denial) on one tenant with its own limit (R, B, b). `make_schedule(seed)`
decides everything from `random.Random(seed)`, and every schedule carries the shapes that
broke the envelope before, mixed at random:

* traffic that leaves its member for longer than `views_idle_ms` (twice it: the idle sweep
  forgets a view within about that) and comes back, and traffic that moves between members;
* on/off bursts (many offers at one instant), flows from 0.5x to 4x R, two members at once;
* idles below the snapshot TTL, past it, below `views_idle_ms` and past it;
* amounts of 1, at b, above b and above B.

`judge` reads the recorded answers (tests/mesh/_envelope.py does the arithmetic):

* envelope: over every interval, admitted <= R*(t1-t0) + B + N*b + R*d;
* starvation: a retried request (every RETRY_EVERY_MS for RETRY_FOR_MS) that an ideal token
  bucket fed the admitted history could have served throughout its retries (>= amount
  tokens the whole time, the bucket charged too with the most owners may escrow for the
  floors of members that paused: `_escrows`) must be admitted, or denied `too_large`
  without a retry_after.
  A window in which the node disclosed that it could not know (`owner_unreachable`,
  `snapshot_stale`: an owner slow to answer on a loaded machine) is counted, not failed;
* honesty: a `too_large` denial carries no retry_after (waiting cannot help), and an amount
  above B is never asked to retry;
* every answer decided (no `error`, no unknown policy).
"""

from __future__ import annotations

import collections
import math
import random
from dataclasses import dataclass, field
from typing import Any

from ratemesh.envelope import percentile
from tests.mesh._envelope import Admission, IdealBucket, violations, worst_interval

__all__ = [
    "Offer",
    "Schedule",
    "Request",
    "Answer",
    "Judgement",
    "make_schedule",
    "judge",
    "RETRY_EVERY_MS",
    "RETRY_FOR_MS",
]

DISCLOSED = frozenset({"owner_unreachable", "snapshot_stale"})  # a degraded answer, said so
RETRY_EVERY_MS = 20
RETRY_FOR_MS = 200
LENGTH_MS = 6500  # offers span about this long


@dataclass(frozen=True, slots=True)
class Offer:
    at_ms: float  # from the schedule's start
    node: int
    amount: int
    retry: bool


@dataclass(frozen=True)
class Schedule:
    seed: int
    members: int
    rate: int  # R, units per second
    burst: int  # B
    cap: int  # b
    offers: tuple[Offer, ...]
    plan: tuple[str, ...]  # the segments, for the failure message

    @property
    def tenant(self) -> str:
        return f"adv{self.seed}"

    def policy(self, metric: str) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant,
            "metric": metric,
            "generation": 1,
            "target_rate": self.rate,
            "global_burst": self.burst,
            "local_burst_cap": self.cap,
        }

    def describe(self) -> str:
        return (
            f"seed={self.seed} tenant={self.tenant} R={self.rate} B={self.burst} b={self.cap} "
            f"N={self.members} offers={len(self.offers)} plan={' '.join(self.plan)}"
        )


class _Builder:
    def __init__(self, seed: int, members: int, views_idle_ms: int, ttl_ms: int) -> None:
        self.rng = rng = random.Random(seed)
        self.members, self.views_idle_ms, self.ttl_ms = members, views_idle_ms, ttl_ms
        self.rate = rng.choice([20, 30, 50, 80])
        self.burst = rng.choice([4, 6, 10, 16])
        self.cap = rng.randint(1, min(4, self.burst - 1))
        self.t = 0.0
        self.offers: list[Offer] = []
        self.plan: list[str] = []

    def amount(self) -> int:
        r, b, burst = self.rng, self.cap, self.burst
        kind = r.choices(
            ["one", "share", "cap", "above_b", "above_B", "any"], [60, 8, 10, 8, 6, 8]
        )[0]
        if kind == "one":
            return 1
        if kind == "share":  # about a worker's even part of b
            return max(1, -(-b // self.members))
        if kind == "cap":
            return b
        if kind == "above_b":
            return b + 1
        if kind == "above_B":
            return burst + r.randint(1, 3)
        return r.randint(1, burst)

    def offer(self, node: int) -> None:
        a = self.amount()
        retry = self.rng.random() < (0.15 if a <= self.cap else 0.5)
        self.offers.append(Offer(round(self.t, 3), node, a, retry))

    def flow(self, nodes: list[int]) -> None:
        mult = self.rng.choice([0.5, 1.0, 1.5, 3.0, 4.0])
        dur = self.rng.uniform(150, 900)
        end, per_ms = self.t + dur, mult * self.rate / 1000
        self.plan.append(f"flow{nodes}x{mult}:{dur:.0f}ms")
        while True:
            self.t += self.rng.expovariate(per_ms)
            if self.t >= end:
                break
            self.offer(self.rng.choice(nodes))
        self.t = end

    def burst_at(self, node: int) -> None:
        k = self.rng.randint(2, self.burst + 2 * self.cap)
        self.plan.append(f"burst[{node}]x{k}")
        for _ in range(k):
            self.offer(node)
        self.t += self.rng.uniform(1, 5)

    def idle(self, long_ok: bool) -> None:
        ttl, vi = self.ttl_ms, self.views_idle_ms
        spans = [(0.25 * ttl, 0.75 * ttl), (1.25 * ttl, 4 * ttl), (0.15 * vi, 0.7 * vi)]
        weights = [3, 3, 2]
        if long_ok:
            spans.append((2.2 * vi, 3 * vi))  # past the sweep that forgets idle views
            weights.append(1)
        lo, hi = self.rng.choices(spans, weights)[0]
        dur = self.rng.uniform(lo, hi)
        self.plan.append(f"idle:{dur:.0f}ms")
        self.t += dur

    def segment(self, allowed: list[int], node: int, long_ok: bool) -> int:
        """One random segment on `node` (or beside it), among the `allowed` members; the
        member the traffic is on afterwards."""
        kind = self.rng.choices(["flow", "burst", "idle", "move"], [45, 15, 25, 15])[0]
        if kind == "flow":
            others = [m for m in allowed if m != node]
            two = bool(others) and self.rng.random() < 0.25
            self.flow([node, self.rng.choice(others)] if two else [node])
        elif kind == "burst":
            self.burst_at(node)
        elif kind == "idle":
            self.idle(long_ok)
        else:
            node = self.rng.choice([m for m in allowed if m != node] or [node])
            self.plan.append(f"move->{node}")
        return node

    def build(self) -> tuple[list[Offer], list[str]]:
        """A free part, then the traffic leaves its home member for longer than twice
        `views_idle_ms` and comes back to it, then a free part again."""
        every = list(range(self.members))
        home = self.rng.randrange(self.members)
        self.plan.append(f"home={home}")
        self.flow([home])
        node = home
        lead_end = self.rng.uniform(300, 1500)
        while self.t < lead_end:
            node = self.segment(every, node, long_ok=False)
        away = [m for m in every if m != home]
        node = self.rng.choice(away)
        self.plan.append(f"leave->{node}")
        back_at = self.t + self.rng.uniform(2.2, 3.0) * self.views_idle_ms
        while self.t < back_at:
            node = self.segment(away, node, long_ok=False)
        self.plan.append(f"back->{home}")
        self.flow([home])
        node = home
        while self.t < LENGTH_MS:
            node = self.segment(every, node, long_ok=True)
        return self.offers, self.plan


def make_schedule(seed: int, *, members: int, views_idle_ms: int, ttl_ms: int) -> Schedule:
    b = _Builder(seed, members, views_idle_ms, ttl_ms)
    offers, plan = b.build()
    return Schedule(seed, members, b.rate, b.burst, b.cap, tuple(offers), tuple(plan))


# -- what the fleet answered, and the judgement --------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    send_ns: int
    recv_ns: int
    allowed: bool
    reason: str
    retry_after_ms: int | None  # None: absent (waiting cannot help)
    error: str | None
    remaining: int | None = None  # what the node said it could still admit
    suspended: str | None = None


@dataclass
class Request:
    offer: Offer
    answers: list[Answer] = field(default_factory=list)

    @property
    def admitted(self) -> Answer | None:
        return next((a for a in self.answers if a.allowed), None)


@dataclass
class Judgement:
    schedule: Schedule
    problems: list[str]  # the envelope, honesty, undecided answers: each a failure
    summary: str
    starved: list[str] = field(default_factory=list)  # judged apart (test_envelope_real)

    @property
    def ok(self) -> bool:
        return not self.problems

    def explain(self, lines: list[str] | None = None) -> str:
        lines = self.problems if lines is None else lines
        kinds = collections.Counter(p.split(":", 1)[0] for p in lines)
        shown = "\n  ".join([f"problems: {dict(sorted(kinds.items()))}", *lines[:12]])
        more = f"\n  ... {len(lines) - 12} more" if len(lines) > 12 else ""
        return f"{self.schedule.describe()}\n{self.summary}\n  {shown}{more}"


def judge(s: Schedule, requests: list[Request], t0_ns: int, d_s: float) -> Judgement:
    """The verdict on one schedule's record, from its start `t0_ns`, with d in seconds."""
    problems: list[str] = []
    starved: list[str] = []
    answers = [a for r in requests for a in r.answers]
    rtts = sorted(a.recv_ns - a.send_ns for a in answers) or [0]
    allowed = s.burst + s.members * s.cap + s.rate * d_s
    # Each admission happened between its ask and its answer, and is checked as such.
    history = [
        Admission(a.recv_ns, r.offer.amount, lo_ns=a.send_ns, where=str(r.offer.node))
        for r in requests
        if (a := r.admitted) is not None
    ]
    admitted = sum(h.units for h in history)
    worst = worst_interval(history, s.rate)
    over = violations(history, s.rate, allowed)
    if over:
        assert worst is not None
        inside = [
            (r.offer.node, a.suspended)
            for r in requests
            if (a := r.admitted) is not None
            and worst.start_ns <= a.send_ns
            and a.recv_ns <= worst.end_ns
        ]
        by_member = dict(sorted(collections.Counter(n for n, _ in inside).items()))
        suspended = dict(collections.Counter(x for _, x in inside if x))
        problems.append(
            f"envelope: {over} interval ends past B+N*b+R*d={allowed:.1f}; worst "
            f"{worst.explain(t0_ns)}; admissions by member {by_member}, "
            f"with a suspension {suspended}"
        )
    for r in requests:
        problems.extend(_honesty(s, r))
    seen: dict[int, list[int]] = collections.defaultdict(list)  # member -> its answers' times
    for r in requests:
        seen[r.offer.node].extend(a.send_ns for a in r.answers)
    ideal = IdealBucket(history + _escrows(s, seen), s.rate, s.burst, t0_ns)
    degraded = 0
    for r in requests:
        why = _starved(s, r, ideal, t0_ns)
        if why and any(a.reason in DISCLOSED for a in r.answers):
            degraded += 1
        elif why:
            starved.append(why)
    offered = sum(o.amount for o in s.offers)
    summary = (
        f"offered {offered} units in {len(s.offers)} requests ({len(answers)} calls), "
        f"admitted {admitted}; worst interval: "
        f"{worst.explain(t0_ns) if worst else '-'}; d={d_s * 1000:.1f}ms, allowed excess "
        f"{allowed:.1f}; caller round trips p50 {percentile(rtts, 0.50) / 1e6:.1f}ms, "
        f"max {rtts[-1] / 1e6:.1f}ms; retry windows denied with a disclosed suspension "
        f"while an ideal bucket held enough: {degraded}"
    )
    return Judgement(s, problems, summary, starved)


def _honesty(s: Schedule, r: Request) -> list[str]:
    out = []
    o = r.offer
    for a in r.answers:
        at = f"amount {o.amount} via {o.node} at {o.at_ms:.0f}ms"
        if a.error is not None or a.reason == "policy_unknown":
            out.append(f"undecided: {at}: {a.reason} {a.error}")
        elif a.reason == "too_large" and a.retry_after_ms is not None:
            out.append(f"too_large with retry_after_ms={a.retry_after_ms}: {at}")
        elif o.amount > s.burst and (a.allowed or a.reason != "too_large"):
            out.append(f"above B answered {a.reason} retry_after_ms={a.retry_after_ms}: {at}")
    return out


# An owner escrows the floor of a member gone silent (docs/partitions.md): at most R / N a
# second, from ESCROW_AFTER_MS after its last report until its idle mark arrives (200 ms,
# and a TTL): the escrow is charged to the bucket like usage, so the bucket the others
# spend from holds that much less for as long as they keep it from filling up.
ESCROW_AFTER_MS = 30
ESCROW_SPAN_MS = 220


def _escrows(s: Schedule, seen: dict[int, list[int]]) -> list[Admission]:
    """The most owners may charge for floors: for each pause of a member longer than
    ESCROW_AFTER_MS, R / N a second over the pause (at most ESCROW_SPAN_MS), charged to
    the reference bucket as usage at the pause's start, so that the starvation judgement
    never counts against the mesh what its owners were entitled to hold back."""
    out = []
    per_ms = s.rate / s.members / 1000
    for times in seen.values():
        times.sort()
        for a, b in zip(times, [*times[1:], times[-1] + ESCROW_SPAN_MS * 2_000_000], strict=True):
            gap_ms = (b - a) / 1e6 - ESCROW_AFTER_MS
            if gap_ms > 0:
                units = per_ms * min(gap_ms, ESCROW_SPAN_MS)
                at = a + ESCROW_AFTER_MS * 1_000_000
                out.append(Admission(at, math.ceil(units), lo_ns=at, where="escrow"))
    return out


def _starved(s: Schedule, r: Request, ideal: IdealBucket, t0_ns: int) -> str | None:
    o = r.offer
    if not o.retry or r.admitted is not None or not r.answers:
        return None
    last = r.answers[-1]
    if last.reason == "too_large" and last.retry_after_ms is None:
        return None  # an honest no: waiting cannot help
    first_ns, last_ns = r.answers[0].send_ns, last.send_ns
    if last_ns - first_ns < (RETRY_FOR_MS - RETRY_EVERY_MS) * 1_000_000:
        return None  # retries cut short: not a full window
    least = ideal.least(first_ns, last_ns)
    if least < o.amount:
        return None  # an exact limiter could have said no somewhere in the window too
    said = sorted(
        {(a.reason, a.retry_after_ms, a.remaining, a.suspended) for a in r.answers}, key=str
    )
    kind = "starved within b" if o.amount <= s.cap else "starved above b"
    return (
        f"{kind}: amount {o.amount} (b={s.cap}) via member {o.node} retried "
        f"{len(r.answers)}x over [{(first_ns - t0_ns) / 1e9:.3f} s, "
        f"{(last_ns - t0_ns) / 1e9:.3f} s] while an ideal bucket held >= {least:.1f}; "
        f"answers (reason, retry_after_ms, remaining, suspended) {said}"
    )

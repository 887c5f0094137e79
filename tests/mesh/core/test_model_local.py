"""`local` and `share` views against a textbook token bucket, under schedules chosen to break
them: bursts from a full bucket, idles of every length (below and past views_idle_ms),
missed ticks, amounts at and above the view's burst, refunds, forgetting and membership
changes. The model (`mesh.testing.reference`) shares no code with the core.

The core has no clock on its hot path: an admission is taken as made at the core's time,
the last tick's. On that clock a `local` view must be exactly a token bucket of (R, B) and a
`share` member one of (ceil(R/N), ceil(B/N)) (docs/guarantees.md):

* safety: replaying every admission and refund at the core's time never takes the
  reference bucket below zero;
* no starvation: right after a tick, an amount within the view's burst that the reference
  bucket holds is admitted;
* an amount above the view's burst is `too_large` with retry_after_ms None.

`test_random_schedules` runs SCHEDULES seeded schedules (a failure prints its seed and
replays with `RATEMESH_MODEL_SEED=<seed>`); `LocalMachine` is the hypothesis form, which
shrinks a failure to a short program. The patterns users found are pinned by name below.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mesh.core.admission import Admission
from mesh.core.config import CoreConfig
from mesh.core.policy import Mode
from mesh.core.verdict import Reason
from mesh.testing.reference import TokenBucket, replay
from tests.mesh._helpers import MS, cache, policy

T, M = "t", "read_iops"
IDLE_MS = 300  # views_idle_ms in these runs: idles below and past it in one schedule
SCHEDULES = int(os.environ.get("RATEMESH_MODEL_SCHEDULES", "10000"))
# (R, B) pairs: equal, B small against R, B above R, tiny, odd numbers that do not divide
LIMITS = [(1000, 1000), (100, 100), (50, 10), (2000, 60), (7, 3), (1, 1), (400, 80), (13, 29)]
WAITS_MS = [0, 1, 3, 5, 6, 12, 20, 100, 250, 1000, 2500, IDLE_MS + 50, 3 * IDLE_MS + 7]


def ceil_div(a: int, n: int) -> int:
    return -(-a // n)


@dataclass
class Twin:
    """One `Admission` beside its reference bucket, on the core's clock."""

    mode: str
    rate: int
    burst: int
    n: int = 1
    idle_ms: int = CoreConfig().views_idle_ms
    now: int = 0  # the schedule's time (ns)
    core: int = 0  # the core's time: the last tick
    history: list[tuple[int, int]] = field(default_factory=list)
    outstanding: int = 0  # admitted and not refunded (what a refund may give back)
    fresh_tick: bool = True  # the last step was a tick at `now`
    resized: bool = False  # membership changed: hold it to the largest share's bucket
    admitted: int = 0
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        p = policy(T, rate=self.rate, burst=self.burst, b=self.burst, mode=self.mode)
        cfg = CoreConfig(views_idle_ms=self.idle_ms)
        self.a = Admission(cache(p), 0, config=cfg, n_live=self.n)
        self.share_rate = ceil_div(self.rate, self.n)
        self.share_burst = ceil_div(self.burst, self.n)
        self.ref = TokenBucket(self.share_rate, self.share_burst, 0)
        self.top_rate, self.top_burst = self.share_rate, self.share_burst

    # -- steps ----------------------------------------------------------------------------

    def wait(self, ms: int, tick: bool = True) -> None:
        self.now += ms * MS
        self.fresh_tick = False
        if tick:
            self.tick()

    def tick(self) -> None:
        self.core = self.now
        self.a.tick(self.now)
        self.fresh_tick = True

    def ticks(self, n: int, every_ms: int = 5) -> None:
        for _ in range(n):
            self.wait(every_ms)

    def admit(self, amount: int) -> bool:
        level = self.ref.tokens(self.core)
        v = self.a.try_admit_detailed(T, M, amount)
        if v.allowed:
            self.history.append((self.core, amount))
            self.ref.force(self.core, amount)
            self.outstanding += amount
            self.admitted += amount
        elif amount > self.share_burst and not self.resized:
            if v.reason is not Reason.TOO_LARGE or v.retry_after_ms is not None:
                self.failures.append(f"{amount} > burst {self.share_burst} answered {v}")
        elif v.reason is Reason.TOO_LARGE and not self.resized:
            self.failures.append(f"{amount} <= burst {self.share_burst} answered too_large")
        elif (
            self.fresh_tick
            and not self.resized
            and v.reason is Reason.RATE_LIMITED
            and level >= amount
        ):
            self.failures.append(
                f"starved: {amount} denied at {self.core} with {float(level):.3f} in the "
                "reference bucket"
            )
        return v.allowed

    def refund(self, amount: int) -> None:
        amount = min(amount, self.outstanding)
        if amount <= 0:
            return
        self.a.refund(T, M, amount)
        self.outstanding -= amount
        self.history.append((self.core, -amount))
        self.ref.give(self.core, amount)

    def evict(self) -> None:
        self.a.evict_idle()

    def resize(self, n: int) -> None:
        """Membership changes (share mode): the model holds it to the largest share seen."""
        self.a.membership(n, False, self.core)
        self.resized = True
        self.top_rate = max(self.top_rate, ceil_div(self.rate, n))
        self.top_burst = max(self.top_burst, ceil_div(self.burst, n))

    # -- the verdict ----------------------------------------------------------------------

    def check(self) -> list[str]:
        rate, burst = (
            (self.top_rate, self.top_burst)
            if self.resized
            else (
                self.share_rate,
                self.share_burst,
            )
        )
        low = replay(self.history, rate, burst)
        out = list(self.failures)
        if low < 0:
            out.append(f"over-admitted: the reference bucket went to {float(low):.3f}")
        return out


def random_schedule(seed: int) -> Twin:
    """A schedule from `seed`: its limit, mode and steps, run on a fresh twin."""
    rng = random.Random(seed)
    rate, burst = rng.choice(LIMITS)
    mode = rng.choice(["local", "share"])
    n = 1 if mode == "local" else rng.randint(1, 5)
    # The idle sweep forgets a full view after views_idle_ms: short, so schedules cross it,
    # or the default, so a view sits full for many ticks and is used again.
    tw = Twin(mode, rate, burst, n, idle_ms=rng.choice([IDLE_MS, CoreConfig().views_idle_ms]))
    sb = tw.share_burst
    amounts = [1, 2, max(1, sb // 2), max(1, sb - 1), sb, sb + 1, burst, burst + 1]
    for _ in range(rng.randint(10, 60)):
        r = rng.random()
        if r < 0.45:
            tw.admit(rng.choice(amounts) if rng.random() < 0.7 else rng.randint(1, sb))
        elif r < 0.55:
            tw.refund(rng.randint(1, max(1, sb)))
        elif r < 0.80:
            tw.wait(rng.choice(WAITS_MS), tick=rng.random() < 0.8)  # a missed tick now and then
        elif r < 0.93:
            tw.ticks(rng.randint(1, 40), rng.choice([1, 5, 6]))
        elif r < 0.97:
            tw.evict()
        elif mode == "share":
            tw.resize(rng.randint(1, 5))
    return tw


def test_random_schedules() -> None:
    only = os.environ.get("RATEMESH_MODEL_SEED")
    seeds = [int(only)] if only else range(SCHEDULES)
    for seed in seeds:
        tw = random_schedule(seed)
        problems = tw.check()
        assert not problems, (
            f"seed {seed} ({tw.mode} R={tw.rate} B={tw.burst} N={tw.n}): {problems}"
        )


# -- the patterns users found, each the shortest schedule that showed it ----------------


def test_a_burst_after_an_idle_is_one_bucket_not_two() -> None:
    """local R=B=1000: 1000, +6 ms, 500, +6 ms, 500, then 2.5 s of 5 ms ticks, repeated.
    A view that sat full was charged at the settle that found it full, seconds before."""
    tw = Twin("local", 1000, 1000)
    for _ in range(3):
        start = tw.admitted
        tw.admit(1000)
        tw.wait(6)
        tw.admit(500)
        tw.wait(6)
        tw.admit(500)
        assert tw.admitted - start <= 1000 + 12, tw.admitted - start  # the bucket: 1,012
        tw.ticks(500)
    assert tw.check() == []


def test_a_full_view_is_charged_at_the_tick_before_its_use() -> None:
    """local R=B=1000: admit 1, wait 2 s, admit 1000, wait 5 ms, admit 1000: 1005 at most."""
    tw = Twin("local", 1000, 1000)
    tw.admit(1)
    tw.ticks(400)  # 2 s of a node's 5 ms ticks
    tw.admit(1000)
    tw.wait(5)
    tw.admit(1000)
    assert tw.admitted - 1 <= 1005
    assert tw.check() == []


def test_share_mode_keeps_its_share_burst_after_an_idle() -> None:
    tw = Twin("share", 1000, 1000, n=3)  # 334 a member
    tw.admit(1)
    tw.ticks(400)  # 2 s of 5 ms ticks
    before = tw.admitted
    tw.admit(334)
    tw.wait(1, tick=True)
    tw.admit(334)
    assert tw.admitted - before <= 335
    assert tw.check() == []


def test_a_refund_never_fills_the_bucket_past_its_burst() -> None:
    """local R=B=100: admit 100, wait 2 s, refund 100, admit 200: 100 at most at once."""
    tw = Twin("local", 100, 100)
    tw.admit(100)
    tw.wait(2000)
    tw.refund(100)
    assert not tw.admit(200)  # above B: too_large, never rate_limited
    assert tw.admit(100)
    assert not tw.admit(1)
    assert tw.check() == []


def test_a_refund_in_the_same_tick_does_not_hide_an_admission() -> None:
    tw = Twin("local", 100, 100)
    tw.admit(60)
    tw.wait(1000)  # full again
    tw.refund(60)  # charged a second ago; the bucket is full: nothing comes back
    tw.admit(10)  # netted against the refund, this was never charged
    n = sum(tw.admit(1) for _ in range(100))
    assert n == 90, n
    assert tw.check() == []


def test_a_late_refund_to_a_forgotten_view_is_not_an_error() -> None:
    tw = Twin("local", 100, 100, idle_ms=IDLE_MS)
    tw.admit(10)
    tw.ticks(3)
    tw.wait(3 * IDLE_MS)  # full and past views_idle_ms: the sweep forgets the view
    tw.ticks(3)
    assert tw.a.gate(T, M) is None
    tw.refund(10)  # legitimate (a short send reported late): nothing to give back
    assert tw.admit(100)
    assert tw.check() == []


def test_an_amount_above_the_share_is_too_large_and_says_waiting_cannot_help() -> None:
    tw = Twin("share", 10, 10, n=2)  # 5 a member
    v = tw.a.try_admit_detailed(T, M, 6)
    assert (v.reason, v.retry_after_ms, v.mode) == (Reason.TOO_LARGE, None, Mode.SHARE)
    assert tw.admit(5)


# -- the hypothesis form ---------------------------------------------------------------


class LocalMachine(RuleBasedStateMachine):
    """The same twin, driven step by step so that a failure shrinks to a short program."""

    tw: Twin

    @initialize(
        limit=st.sampled_from(LIMITS), mode=st.sampled_from(["local", "share"]), n=st.integers(1, 4)
    )
    def start(self, limit: tuple[int, int], mode: str, n: int) -> None:
        self.tw = Twin(mode, *limit, n=1 if mode == "local" else n, idle_ms=IDLE_MS)

    @rule(part=st.sampled_from([1, 2, 0.5, 1.0, 1.01, 2.0]))
    def admit(self, part: float) -> None:
        sb = self.tw.share_burst
        self.tw.admit(
            int(part) if isinstance(part, int) and part <= 2 else max(1, round(sb * part))
        )

    @rule(amount=st.integers(1, 40))
    def refund(self, amount: int) -> None:
        self.tw.refund(amount)

    @rule(ms=st.sampled_from(WAITS_MS), tick=st.booleans())
    def wait(self, ms: int, tick: bool) -> None:
        self.tw.wait(ms, tick)

    @rule(n=st.integers(1, 30), every=st.sampled_from([1, 5]))
    def ticks(self, n: int, every: int) -> None:
        self.tw.ticks(n, every)

    @rule()
    def evict(self) -> None:
        self.tw.evict()

    @invariant()
    def conforms(self) -> None:
        if hasattr(self, "tw"):
            assert self.tw.check() == []


TestLocalMachine = LocalMachine.TestCase
TestLocalMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_schedules_replay_exactly(seed: int) -> None:
    """A seed decides everything: the same schedule twice gives the same history."""
    assert random_schedule(seed).history == random_schedule(seed).history

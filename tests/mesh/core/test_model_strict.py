"""`strict` mode against the every-interval envelope, under schedules chosen to break it.

Four workers' `CreditDesk`s against a real `governor.engine.Engine` on a manual clock (the
harness of test_strict_share), driven by seeded schedules that move the demand between
workers and back, idle past the desks' idle and the blocks' TTL, burst on and off, and ask
amounts of 1, a share of B, B and above B. Every admission's instant is held against
`mesh.testing.reference.envelope_excess`, which shares no code with the admission path:
admitted(t0, t1) <= R*(t1 - t0) + B over every interval, with nothing added (docs/strict.md).
An amount above governord's B is `too_large` once the worker has learned B (here the mesh's
policy is wider than governord's node, as a harness; a policy that matches its node answers
`too_large` from the first ask).
"""

from __future__ import annotations

import os
import random

import pytest

from governor.engine import CreditGrant
from mesh.core.effects import ReserveCredit, ReturnCredit
from mesh.core.verdict import Reason
from mesh.testing.reference import envelope_excess
from ratemesh.credit import node_burst, rate_burst
from tests.mesh._helpers import MS
from tests.mesh.core.test_strict_share import BURST, RATE, RTT_MS, TICK_MS, Worker, _fleet

pytestmark = pytest.mark.slow  # a few seconds of simulated milliseconds per schedule
SCHEDULES = int(os.environ.get("RATEMESH_STRICT_SCHEDULES", "60"))


def run(seed: int) -> tuple[list[tuple[int, int]], list[str]]:
    """One schedule: (admission ms, units) and the problems seen."""
    rng = random.Random(seed)
    now = [0]
    engine, gclock, workers, node = _fleet(now)
    plan: list[tuple[int, list[int], float, list[int]]] = []  # (ms, workers, per ms, amounts)
    for _ in range(rng.randint(3, 7)):
        ms = rng.choice([20, 150, 600, 2_500, 3_500])  # past idle_ms (2 s) and the TTL (3 s)
        if rng.random() < 0.3:
            plan.append((ms, [], 0.0, [1]))  # idle
        else:
            who = [rng.randrange(4)] if rng.random() < 0.6 else list(range(4))
            per_ms = RATE / 1000 * rng.choice([0.5, 1.5, 4])
            plan.append((ms, who, per_ms, rng.choice([[1], [50], [250], [1, BURST], [BURST + 1]])))
    admitted: list[tuple[int, int]] = []
    problems: list[str] = []
    ms = 0
    for span, who, per_ms, amounts in plan:
        carry = 0.0
        for _ in range(span):
            ms += 1
            now[0] = ms
            gclock.advance(1)
            carry += per_ms
            offers = []
            while carry >= 1 and who:
                carry -= 1
                offers.append((rng.choice(who), rng.choice(amounts)))
            for i, w in enumerate(workers):
                _deliver(w, ms)
                for j, amount in offers:
                    if j != i:
                        continue
                    v = w.gate.admit(amount)
                    if v.allowed:
                        admitted.append((ms, amount))
                    elif (
                        amount > BURST
                        and w.gate.holder.burst is not None  # governord has stated B
                        and v.reason is not Reason.TOO_LARGE
                    ):
                        problems.append(f"{amount} > B answered {v}")
                if ms % TICK_MS == 0:
                    w.desk.tick(ms * MS)
                _send(w, ms, engine, node)
    times = [t * MS for t, _ in admitted]
    excess = envelope_excess(times, [u for _, u in admitted], RATE, BURST)
    if excess > 0:
        problems.append(f"over the envelope by {excess:.2f} units")
    return admitted, problems


def _deliver(w: Worker, ms: int) -> None:
    while w.back and w.back[0][0] <= ms:
        _, asked, got = w.back.popleft()
        if isinstance(got, CreditGrant):
            w.desk.granted(asked, got.block_id, got.units, got.ttl_ms)
        else:
            w.desk.failed(asked, unreachable=False, burst=rate_burst({"limit": got.limit}))


def _send(w: Worker, ms: int, engine: object, node: int) -> None:
    for e in w.desk.take():
        w.out.append((ms + RTT_MS // 2, e))
    while w.out and w.out[0][0] <= ms:
        _, e = w.out.popleft()
        if isinstance(e, ReserveCredit):
            if not w.looked_up:
                w.looked_up = True
                burst = node_burst({"rates": {"read_iops": [RATE, BURST]}}, "read_iops")
                assert burst is not None
                w.desk.learned_burst(w.gate.key, burst)
            got = engine.reserve_credit(w.session, node, "read_iops", e.request.units)  # type: ignore[attr-defined]
            w.back.append((ms + RTT_MS // 2, e, got))
        elif isinstance(e, ReturnCredit):
            engine.return_credit(w.session, e.block_id, e.unused)  # type: ignore[attr-defined]


def test_strict_schedules_keep_the_envelope() -> None:
    only = os.environ.get("RATEMESH_MODEL_SEED")
    seeds = [int(only)] if only else range(SCHEDULES)
    bad = []
    for seed in seeds:
        admitted, problems = run(seed)
        if problems:
            bad.append(f"seed {seed}: {problems[:3]}")
    assert not bad, "\n".join(bad)

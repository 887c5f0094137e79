"""Several workers' strict gates share one small bucket (B < R x 1 s).

Four `CreditDesk`s, each a worker offering 1.25 x R, against a real `governor.engine.Engine`
on a manual clock, with round trips of a few milliseconds. A block counts whole against B
until it is spent out, so with blocks of a second of demand one worker's block took the whole
bucket and the others were denied and backed off up to 500 ms. Blocks are now at most a share
of B once governord has stated it (an empty bucket's denial carries it), and an empty bucket's
denial waits `lead_ms`, like a partial grant, with no doubling. The test holds the shares
close, the bucket used, the calls few and the envelope kept. Sans-I/O: the test carries the
desks' effects to the engine itself, as the node's `CreditDriver` does."""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field
from functools import partial

from governor.engine import (
    ROOT_ID,
    Created,
    CreditGrant,
    Denial,
    Engine,
    EngineConfig,
    ManualClock,
    Rate,
)
from mesh.core.admission import CreditDesk, StrictGate
from mesh.core.effects import Effect, ReserveCredit, ReturnCredit
from ratemesh.credit import CreditConfig, node_burst, rate_burst
from ratemesh.envelope import excess_over_times
from tests.mesh._helpers import MS, policy

RATE, BURST = 2_000, 1_000  # B is half a second of R
WORKERS = 4
OFFER_PER_MS = (2, 3)  # each worker offers 2.5 units per ms: 1.25 x R, 5 x R in all
RTT_MS = 4  # each way: 2 ms
TICK_MS = 5
SECONDS = 10
CREDIT = CreditConfig(horizon_ms=1_000, lead_ms=250, idle_ms=2_000)  # bench strict's


@dataclass
class Worker:
    desk: CreditDesk
    gate: StrictGate
    session: int
    admitted: list[int] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)  # units of each reserve sent
    # (deliver at ms, effect) in flight to governord, and replies back
    out: deque[tuple[int, Effect]] = field(default_factory=deque)
    back: deque[tuple[int, ReserveCredit, CreditGrant | Denial]] = field(default_factory=deque)
    looked_up: bool = False


def _fleet(clock_ms: list[int]) -> tuple[Engine, ManualClock, list[Worker], int]:
    gclock = ManualClock(0)
    engine = Engine(gclock, lambda e: None, EngineConfig(credit_ttl_ms=3_000))
    node = engine.create_node(None, ROOT_ID, "load", rates={"read_iops": Rate(RATE, BURST)})
    assert isinstance(node, Created)
    workers = []
    for i in range(WORKERS):
        sid, _ = engine.open_session(node.node_id, 60_000, hashlib.sha256(b"%d" % i).hexdigest())
        desk = CreditDesk(partial(_clock_ns, clock_ms, i * 137_911), CREDIT)  # clocks apart
        gate = desk.open(policy("load", mode="strict", rate=10**6, burst=10**6), None)
        workers.append(Worker(desk, gate, sid))
    return engine, gclock, workers, node.node_id


def _clock_ns(clock_ms: list[int], offset_ns: int) -> int:
    return clock_ms[0] * MS + offset_ns


def _run(seconds: int = SECONDS) -> tuple[list[Worker], int]:
    now = [0]
    engine, gclock, workers, node = _fleet(now)
    calls = 0
    for ms in range(seconds * 1000):
        now[0] = ms
        gclock.advance(1)
        for w in workers:
            while w.back and w.back[0][0] <= ms:  # replies that arrived
                _, asked, got = w.back.popleft()
                if isinstance(got, CreditGrant):
                    w.desk.granted(asked, got.block_id, got.units, got.ttl_ms)
                else:
                    d = {"reason": got.reason.value, "limit": got.limit}  # the wire's detail
                    w.desk.failed(asked, unreachable=False, burst=rate_burst(d))
            for _ in range(OFFER_PER_MS[ms % 2]):
                if w.gate.admit(1).allowed:
                    w.admitted.append(ms)
            if ms % TICK_MS == 0:
                w.desk.tick(ms * MS)
            for e in w.desk.take():
                w.out.append((ms + RTT_MS // 2, e))
            while w.out and w.out[0][0] <= ms:  # calls that reached governord
                _, e = w.out.popleft()
                calls += 1
                if isinstance(e, ReserveCredit):
                    if not w.looked_up:  # the driver reads the node's rate before a first reserve
                        w.looked_up = True
                        calls += 1
                        info = {"rates": {"read_iops": [RATE, BURST]}}  # GetNode's, on the wire
                        burst = node_burst(info, "read_iops")
                        assert burst is not None
                        w.desk.learned_burst(w.gate.key, burst)
                    w.asked.append(e.request.units)
                    got = engine.reserve_credit(w.session, node, "read_iops", e.request.units)
                    w.back.append((ms + RTT_MS // 2, e, got))
                elif isinstance(e, ReturnCredit):
                    engine.return_credit(w.session, e.block_id, e.unused)
    return workers, calls


def test_workers_share_a_small_bucket_closely_and_use_it() -> None:
    workers, calls = _run()
    shares = [len(w.admitted) for w in workers]
    total = sum(shares)
    times = sorted(t * MS for w in workers for t in w.admitted)
    assert excess_over_times(times, [1] * total, RATE, BURST) <= RATE / 1000  # 1 ms of R
    assert total >= 0.9 * (RATE * SECONDS + BURST), shares
    # before: 14,273 vs 559 here (a block of a second of demand, doubling waits); 861 vs
    # 6,073 in one run of bench strict
    assert min(shares) >= 0.35 * max(shares), shares  # 0.4-0.8 over other clock offsets
    assert calls / total <= 0.025, (calls, total)  # 0.019-0.022 over other clock offsets
    share = BURST * CREDIT.burst_share_ppm // 1_000_000
    for w in workers:
        assert w.gate.holder.burst == BURST  # read from its node before its first reserve
        # no block asked is more than a share of it (the first one was sized before)
        assert max(w.asked[1:]) <= share, w.asked[:8]

"""Several reporters and one owner over a fake clock, a fake network with delays, drops,
duplicates and reordering; hypothesis drives the schedule and shrinks any failure.

Checked after every step:
* a view with a fresh snapshot admits no more than its allowance from that snapshot;
* a stale view admits nothing new, unless it serves from its floor (cut off from its owner,
  docs/partitions.md), and then no more than the floor has left;
* over every window [t, now], the fleet admitted at most the window's GCRA allowance
  (B + R*(now - t)) plus the envelope N*b + R*d.
"""

from __future__ import annotations

import heapq
import random

import pytest
from hypothesis import settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mesh.core.config import MS, CoreConfig
from mesh.core.effects import Effect, FetchPolicy, Send
from mesh.core.gcra import NS_PER_S
from mesh.core.member import Member
from mesh.core.messages import Message
from mesh.core.policy import Metric, PolicyCache, TenantRatePolicy
from mesh.core.reporter import GlobalGate, SnapshotState
from mesh.core.ring import Ring
from mesh.core.verdict import Reason

pytestmark = pytest.mark.slow  # hypothesis state machine: tens of seconds

R, B, b = 2000, 60, 12
WORKERS = ["w0", "w1", "w2"]
MAX_DELAY_MS = 3
START = 10 * NS_PER_S  # owners have held their ring positions for a while


class MeshMachine(RuleBasedStateMachine):
    # A short views_idle_ms, so that `rest` idles past it and the idle sweep forgets views.
    CONFIG = CoreConfig(views_idle_ms=300)

    def __init__(self) -> None:
        super().__init__()
        self.cfg = self.CONFIG
        self.policy = TenantRatePolicy("t", Metric.READ_IOPS, 1, R, B, b)
        ring = Ring(WORKERS, 1)
        policies = PolicyCache([self.policy])
        self.members = {w: Member(w, 1, ring, policies, 0, config=self.cfg) for w in WORKERS}
        self.now = START
        self.net: list[tuple[int, int, str, Message]] = []
        self.seq = 0
        self.next_tick = {w: START + i * MS for i, w in enumerate(WORKERS)}
        self.history: list[tuple[int, int]] = [(START, 0)]  # (time, admitted so far)
        self.admitted = 0
        self.rng = random.Random(0)
        self.at_snapshot: dict[str, tuple[tuple[int, int, int], int]] = {}
        self.dropped = False
        self.worst = -1e9
        self.cut_until: dict[str, int] = {}  # worker -> time its messages get through again

    @initialize(seed=st.integers(0, 2**32 - 1))
    def seed(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def gate(self, w: str) -> GlobalGate | None:
        v = self.members[w].admission.gate("t", "read_iops")
        assert v is None or isinstance(v, GlobalGate)
        return v

    # -- the network ------------------------------------------------------------------------

    def carry(self, src: str, effects: list[Effect]) -> None:
        for e in effects:
            assert not isinstance(e, FetchPolicy)  # every member holds the policy
            if isinstance(e, Send):
                if self.cut_until.get(src, 0) > self.now or self.cut_until.get(e.to, 0) > self.now:
                    self.dropped = True
                    continue  # partitioned: lost
                delay = 0 if e.to == src else self.rng.randint(0, MAX_DELAY_MS * MS)
                self.seq += 1
                heapq.heappush(self.net, (self.now + delay, self.seq, e.to, e.message))

    def deliver(self, dst: str, msg: Message) -> None:
        self.carry(dst, self.members[dst].deliver(self.now, msg))
        v = self.gate(dst)
        if v is not None and v.state is SnapshotState.FRESH:
            snap = self.at_snapshot.get(dst)
            if snap is None or snap[0] != v.snap_order:
                self.at_snapshot[dst] = (v.snap_order, v.unacked)

    def run_to(self, t: int) -> None:
        while True:
            due_msg = self.net[0][0] if self.net else None
            due_tick = min(self.next_tick.values())
            nxt = min(x for x in (due_msg, due_tick) if x is not None)
            if nxt > t:
                break
            self.now = nxt
            if due_msg is not None and due_msg == nxt:
                _, _, dst, msg = heapq.heappop(self.net)
                self.deliver(dst, msg)
            else:
                w = min(self.next_tick, key=lambda k: (self.next_tick[k], k))
                self.carry(w, self.members[w].tick(self.now))
                self.next_tick[w] += self.cfg.sync_interval_ns
        self.now = t

    # -- rules ------------------------------------------------------------------------------

    @rule(n=st.integers(1, 40))
    def admit_everywhere(self, n: int) -> None:
        for w in WORKERS:
            self.admit(w, n)

    @rule(n=st.integers(1, 60))
    def fan_out(self, n: int) -> None:
        """Every worker reports a little and hears back; then all burst at once."""
        self.admit_everywhere(1)
        self.run_to(self.now + (self.cfg.sync_interval_ms + 2 * MAX_DELAY_MS + 1) * MS)
        self.admit_everywhere(n)

    @rule(w=st.sampled_from(WORKERS), ms=st.integers(5, 60))
    def partition(self, w: str, ms: int) -> None:
        """Cut a worker off: its messages, both ways, are lost for `ms`."""
        self.cut_until[w] = self.now + ms * MS

    @rule(w=st.sampled_from(WORKERS), n=st.integers(1, 60))
    def isolate_then_admit(self, w: str, n: int) -> None:
        """Cut a worker off until its view must be stale, then offer it work."""
        self.partition(w, 60)
        self.run_to(self.now + (self.cfg.snapshot_ttl_ms + self.cfg.sync_interval_ms + 1) * MS)
        self.admit(w, n)

    @rule(w=st.sampled_from(WORKERS), n=st.integers(1, 60))
    def admit(self, w: str, n: int) -> None:
        before = self.gate(w)
        stale = before is not None and before.state is SnapshotState.STALE
        floor_left = before.avail if before is not None and stale and before.floor else 0
        got = sum(self.members[w].admission.try_admit("t", "read_iops").allowed for _ in range(n))
        if stale:
            assert got <= floor_left, f"a stale view admitted {got}, its floor had {floor_left}"
        self.admitted += got
        self.history.append((self.now, self.admitted))
        v = self.gate(w)
        assert v is not None
        if v.state is SnapshotState.FRESH and w in self.at_snapshot:
            order, unacked0 = self.at_snapshot[w]
            if order == v.snap_order:
                # Of what was unacknowledged then, what the snapshot already reflected
                # (reports past a gap its owner applied) is not subtracted again.
                since = v.unacked - unacked0
                assert since <= max(0, v.allowance - unacked0 + v.applied_above), (
                    f"{w} admitted {since} since its snapshot, allowance {v.allowance}, "
                    f"unacked then {unacked0}, of it applied past a gap {v.applied_above}"
                )

    @rule(ms=st.integers(1, 25))
    def advance(self, ms: int) -> None:
        self.run_to(self.now + ms * MS)

    @rule(ms=st.sampled_from([60, 320, 700]))
    def rest(self, ms: int) -> None:
        """An idle past the reporter lease, and past views_idle_ms: traffic that comes back
        to a worker finds its view forgotten (and made again)."""
        self.run_to(self.now + ms * MS)

    @rule(w=st.sampled_from(WORKERS), amount=st.integers(1, b + 1), n=st.integers(1, 8))
    def admit_amount(self, w: str, amount: int, n: int) -> None:
        """Amounts from 1 to above b: above b is too_large at once; up to b can pass."""
        for _ in range(n):
            v = self.members[w].admission.try_admit("t", "read_iops", amount)
            if amount > b:
                assert not v.allowed and v.reason is Reason.TOO_LARGE, v
            elif v.allowed:
                self.admitted += amount
                self.history.append((self.now, self.admitted))

    @precondition(lambda self: bool(self.net))
    @rule()
    def drop(self) -> None:
        heapq.heappop(self.net)
        self.dropped = True

    @precondition(lambda self: bool(self.net))
    @rule()
    def duplicate(self) -> None:
        t, _, dst, msg = self.net[0]
        self.seq += 1
        heapq.heappush(self.net, (t + self.rng.randint(0, MAX_DELAY_MS * MS), self.seq, dst, msg))

    @precondition(lambda self: len(self.net) >= 2)
    @rule()
    def reorder(self) -> None:
        (t1, s1, d1, m1), (t2, s2, d2, m2) = self.net[0], self.net[1]
        self.net[0], self.net[1] = (t1, s1, d2, m2), (t2, s2, d1, m1)
        heapq.heapify(self.net)

    # -- the envelope -----------------------------------------------------------------------

    @invariant()
    def within_envelope(self) -> None:
        cfg = self.cfg
        # d: a report waits for the flush, crosses, and the answer crosses back; a lost
        # message is resent after at most report_retry_max_ms.
        d_ns = 2 * cfg.sync_interval_ns + 2 * MAX_DELAY_MS * MS
        if self.dropped:
            d_ns += cfg.report_retry_max_ms * MS + cfg.snapshot_ttl_ns
        envelope = len(WORKERS) * b + R * d_ns / NS_PER_S
        worst = -1e9
        for t, count in self.history:
            window = self.admitted - count
            allowance = B + R * (self.now - t) / NS_PER_S
            worst = max(worst, window - allowance)
            assert window <= allowance + envelope, (
                f"admitted {window} in [{t}, {self.now}]: allowance {allowance} + "
                f"envelope {envelope}"
            )
        self.worst = max(self.worst, worst)

    def teardown(self) -> None:
        # Steer the search toward schedules that come closest to breaking the envelope.
        target(self.worst, label="excess over the window's GCRA allowance")


MeshMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestMeshEnvelope = MeshMachine.TestCase

"""Hypothesis state machine over credit blocks: workers (``ratemesh.credit.CreditHolder``)
reserve with delays, spend, return, and governord restarts in between; C1-C3 after every step
and C4 at the end (``governor.testing.credit``), so a failure shrinks to a short program."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from governor.engine import (
    ROOT_ID,
    Created,
    CreditGrant,
    Engine,
    ManualClock,
    Rate,
    SessionEnded,
)
from governor.testing.checks import Auditor, canonical
from ratemesh.credit import CreditConfig, CreditHolder

pytestmark = pytest.mark.slow  # hypothesis state machine: several seconds


class CreditMachine(RuleBasedStateMachine):
    @initialize(
        per_s=st.sampled_from([0, 10, 200]),
        burst=st.integers(1, 30),
        child_burst=st.integers(1, 30),
    )
    def setup(self, per_s: int, burst: int, child_burst: int) -> None:
        self.clock = ManualClock(1_000)
        self.auditor = Auditor()
        self.engine = Engine(self.clock, self.auditor)
        self.auditor.engine = self.engine
        tenant = self.engine.create_node(
            None, ROOT_ID, "t", quotas={"http": 200}, rates={"http": Rate(per_s, burst)}
        )
        assert isinstance(tenant, Created)
        child = self.engine.create_node(
            None, tenant.node_id, "c", rates={"http": Rate(50, child_burst)}
        )
        assert isinstance(child, Created)
        self.nodes = [tenant.node_id, child.node_id]
        self.sessions = []
        for i in range(2):
            token = hashlib.sha256(b"%d" % i).hexdigest()
            sid, _ = self.engine.open_session(tenant.node_id, 60_000, token)
            self.sessions.append(sid)
        config = CreditConfig(rho_ppm=1_000, epsilon_ms=0, idle_ms=500)
        self.holders = {(s, n): CreditHolder(config) for s in self.sessions for n in self.nodes}

    def _holder(self, i: int) -> tuple[tuple[int, int], CreditHolder]:
        key = sorted(self.holders)[i % len(self.holders)]
        return key, self.holders[key]

    @rule(
        i=st.integers(0, 3),
        units=st.integers(1, 25),
        out=st.integers(0, 300),
        back=st.integers(0, 300),
    )
    def reserve(self, i: int, units: int, out: int, back: int) -> None:
        (sid, node), holder = self._holder(i)
        request = holder.begin(self.clock.now_ms(), units)
        if request is None:
            return
        self.clock.advance(out)
        try:
            got = self.engine.reserve_credit(sid, node, "http", units)
        except SessionEnded:
            holder.failed(request, unreachable=False)
            return
        self.clock.advance(back)
        if isinstance(got, CreditGrant):
            holder.granted(self.clock.now_ms(), request, got.block_id, got.units, got.ttl_ms)
        else:
            holder.failed(request, unreachable=False)

    @rule(i=st.integers(0, 3), units=st.integers(1, 5), step=st.integers(0, 50))
    def spend(self, i: int, units: int, step: int) -> None:
        (sid, _), holder = self._holder(i)
        now = self.clock.now_ms()
        for block_id, n in holder.try_spend(now, units).taken:
            self.auditor.credit.on_spend(now, sid, block_id, n)
        self.clock.advance(step)

    @rule(i=st.integers(0, 3))
    def spend_at_the_deadline(self, i: int) -> None:
        """The riskiest moment a worker may spend: the last millisecond of a block's local life."""
        (sid, _), holder = self._holder(i)
        now = self.clock.now_ms()
        last = max((b.expires_at_ms for b in holder.blocks.values() if b.left), default=None)
        if last is None or last - 1 < now:
            return
        self.clock.advance(last - 1 - now)
        self.spend(i, 1, 0)

    @rule(i=st.integers(0, 3), leaving=st.booleans(), twice=st.booleans())
    def give_back(self, i: int, leaving: bool, twice: bool) -> None:
        (sid, _), holder = self._holder(i)
        for block_id, unused in holder.take_returns(self.clock.now_ms(), leaving=leaving):
            for _ in range(2 if twice else 1):
                self.engine.return_credit(sid, block_id, unused)

    @rule(ms=st.sampled_from([1, 10, 100, 1_000, 9_700, 12_000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        for sid in self.sessions:
            try:
                self.engine.heartbeat(sid)
            except SessionEnded:
                pass

    @rule(from_snapshot=st.booleans())
    def restart(self, from_snapshot: bool) -> None:
        self.engine.tick()
        before = canonical(self.engine)
        if from_snapshot:
            snap = json.loads(json.dumps(self.engine.snapshot()))
            self.engine = Engine.restore(snap, [], self.clock, self.auditor)
        else:
            self.engine = Engine.restore(None, list(self.auditor.events), self.clock, self.auditor)
        self.auditor.engine = self.engine
        assert canonical(self.engine) == before

    @precondition(lambda self: hasattr(self, "engine"))
    @invariant()
    def level_plus_outstanding_within_the_burst(self) -> None:
        self.auditor.credit.check_buckets(self.engine, self.clock.now_ms())

    def teardown(self) -> None:
        if hasattr(self, "auditor"):
            self.auditor.credit.check_envelope()


TestCredit = CreditMachine.TestCase
TestCredit.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

"""Hypothesis state machine over the engine: the same invariant checker as the seeded run, but a
failure shrinks to a short program. Derandomized, so CI runs the same examples every time."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from governor.engine import (
    ROOT_ID,
    Denial,
    Engine,
    Granted,
    ManualClock,
    NodeState,
    NotFound,
    Queued,
    SessionEnded,
)
from governor.testing.checks import Auditor, check_state

pytestmark = pytest.mark.slow  # hypothesis state machine: several seconds


class EngineMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.clock = ManualClock(0)
        self.auditor = Auditor()
        self.engine = Engine(self.clock, self.auditor)
        self.auditor.engine = self.engine
        self.terminal: dict[int, NodeState] = {}
        self.engine.set_limit(None, ROOT_ID, "db", 2)
        self.engine.set_quota(None, ROOT_ID, "http", 50)
        self.tenants = []
        for i in range(2):
            created = self.engine.create_node(None, ROOT_ID, f"t{i}", limits={"db": 1 + i})
            assert not isinstance(created, Denial)
            self.tenants.append(created.node_id)
        self.nodes = list(self.tenants)
        self.sessions = []
        for i, t in enumerate(self.tenants):
            sid, _ = self.engine.open_session(t, 1_000, hashlib.sha256(b"%d" % i).hexdigest())
            self.sessions.append((sid, t))
        self.leases: list[tuple[int, int]] = []
        self.waiters: list[tuple[int, int]] = []

    def _scope_node(self, i: int, j: int) -> tuple[int, int]:
        sid, scope = self.sessions[i % len(self.sessions)]
        inside = [
            n
            for n in self.nodes
            if n in self.engine.state.nodes
            and any(a.id == scope for a in self.engine.state.chain(n))
        ]
        return sid, inside[j % len(inside)] if inside else scope

    @rule(i=st.integers(0, 9), j=st.integers(0, 9), quota=st.none() | st.integers(0, 20))
    def create(self, i: int, j: int, quota: int | None) -> None:
        sid, parent = self._scope_node(i, j)
        try:
            created = self.engine.create_node(
                sid, parent, "n", quotas={} if quota is None else {"http": quota}, limits={"db": 1}
            )
        except (SessionEnded, NotFound):
            return
        if not isinstance(created, Denial):
            self.nodes.append(created.node_id)

    @rule(i=st.integers(0, 9), j=st.integers(0, 9), amount=st.integers(1, 15))
    def consume(self, i: int, j: int, amount: int) -> None:
        sid, node = self._scope_node(i, j)
        try:
            self.engine.consume(sid, node, "http", amount)
        except (SessionEnded, NotFound):
            pass

    @rule(i=st.integers(0, 9), j=st.integers(0, 9))
    def acquire(self, i: int, j: int) -> None:
        sid, node = self._scope_node(i, j)
        try:
            result = self.engine.acquire(sid, node, "db")
        except (SessionEnded, NotFound):
            return
        if isinstance(result, Granted):
            self.leases.append((sid, result.lease_id))
        elif isinstance(result, Queued):
            self.waiters.append((sid, result.waiter_id))

    @rule(k=st.integers(0, 99))
    def release(self, k: int) -> None:
        if self.leases:
            sid, lease_id = self.leases.pop(k % len(self.leases))
            try:
                self.engine.release(sid, lease_id)
            except NotFound:
                pass

    @rule(k=st.integers(0, 99), cancel=st.booleans())
    def waiter(self, k: int, cancel: bool) -> None:
        if not self.waiters:
            return
        sid, wid = self.waiters.pop(k % len(self.waiters))
        try:
            if cancel:
                self.engine.cancel_wait(sid, wid)
                return
            out = self.engine.take_outcome(sid, wid)
        except NotFound:
            return
        if out is None:
            self.waiters.append((sid, wid))
        elif isinstance(out, Granted):
            self.leases.append((sid, out.lease_id))

    @rule(i=st.integers(0, 9), j=st.integers(0, 9), cancel=st.booleans())
    def end(self, i: int, j: int, cancel: bool) -> None:
        sid, node = self._scope_node(i, j)
        if node in self.tenants:
            return
        try:
            self.engine.end_node(sid, node, NodeState.CANCELLED if cancel else NodeState.DONE)
        except (SessionEnded, NotFound):
            pass

    @rule(i=st.integers(0, 9), limit=st.none() | st.integers(0, 3))
    def set_limit(self, i: int, limit: int | None) -> None:
        self.engine.set_limit(None, self.tenants[i % 2], "db", limit)

    @rule(ms=st.sampled_from([1, 100, 600, 1_500]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(i=st.integers(0, 9))
    def heartbeat(self, i: int) -> None:
        sid, scope = self.sessions[i % len(self.sessions)]
        try:
            self.engine.heartbeat(sid)
        except SessionEnded:
            n = len(self.sessions)
            new, _ = self.engine.open_session(scope, 1_000, hashlib.sha256(b"s%d" % n).hexdigest())
            self.sessions[i % len(self.sessions)] = (new, scope)

    @invariant()
    def invariants_hold(self) -> None:
        if hasattr(self, "engine"):
            check_state(self.engine, self.auditor, self.terminal)


TestEngineMachine = EngineMachine.TestCase
TestEngineMachine.settings = settings(
    max_examples=60,
    stateful_step_count=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

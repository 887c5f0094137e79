"""In-flight caps as hypothesis state machines, checked against a model written apart from
the code: a plain set of held leases per worker, counted per scope.

Global mode: three workers acquire and release, tick (report), and exchange reports and
grants over a link that delays, reorders and drops; workers crash (their slots go with the
process, a new epoch starts empty), the owner's process crashes (its counts are lost), and
the clock jumps past every TTL. Invariants at every step (docs/policies.md):

* the fleet's in-flight total never passes C + N x b (the disclosed bound);
* while the owner never restarted and never dropped a member that still held slots, it
  never passes C;
* each desk's gauge equals the model's count of its leases.

Local and share: each worker's gauge never passes C (local) or ceil(C / N_live) (share).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mesh.core.concurrency import (
    SlotDesk,
    SlotGrant,
    SlotOwner,
    SlotReport,
    SlotTimings,
    global_excess,
    ring_key,
)
from mesh.core.ring import Ring
from mesh.core.shares import share_of
from ratemesh.policy import Mode, TenantRatePolicy

IDS = ("a", "b", "c")
RING = Ring(IDS, 1)
TIMINGS = SlotTimings(lease_ttl_ms=40, member_ttl_ms=120)
SCOPE = ("t", "inflight")
OWNER = RING.owner_of(ring_key(SCOPE))


class GlobalSlots(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.epochs = dict.fromkeys(IDS, 1)
        self.desks = {m: SlotDesk(m, 1, TIMINGS) for m in IDS}
        self.owner = SlotOwner(OWNER, TIMINGS)
        self.held: dict[str, set[int]] = {m: set() for m in IDS}  # the model
        self.net: list[tuple[str, str, SlotReport | SlotGrant]] = []  # (from, to, message)
        self.exact = True  # no owner restart, no live holder dropped: fleet <= C
        self.policy = TenantRatePolicy("t", "inflight", 1, concurrency=6, mode=Mode.GLOBAL)

    @initialize(cap=st.integers(1, 12), b=st.integers(1, 12))
    def configure(self, cap: int, b: int) -> None:
        self.policy = TenantRatePolicy(
            "t", "inflight", 1, concurrency=cap, local_burst_cap=min(b, cap), mode=Mode.GLOBAL
        )

    @rule(m=st.sampled_from(IDS), k=st.integers(1, 8))
    def acquire(self, m: str, k: int) -> None:
        for _ in range(k):
            v = self.desks[m].acquire(self.policy, self.now, len(IDS))
            if v.allowed:
                assert v.lease not in self.held[m]
                self.held[m].add(v.lease)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from([m for m in IDS if self.held[m]]))
        lease = data.draw(st.sampled_from(sorted(self.held[m])))
        assert self.desks[m].release(lease)
        self.held[m].discard(lease)

    @rule(m=st.sampled_from(IDS))
    def tick(self, m: str) -> None:
        for to, report in self.desks[m].tick(self.now, RING):
            self.net.append((m, to, report))

    @rule()
    def sync_round(self) -> None:
        """Every worker reports and the link delivers everything, in order."""
        for m in IDS:
            self.tick(m)
        while self.net:
            self._deliver(*self.net.pop(0))

    @precondition(lambda self: bool(self.net))
    @rule(data=st.data(), drop=st.booleans())
    def deliver(self, data: st.DataObject, drop: bool) -> None:
        i = data.draw(st.integers(0, len(self.net) - 1))
        src, to, msg = self.net.pop(i)
        if not drop:
            self._deliver(src, to, msg)

    def _deliver(self, src: str, to: str, msg: SlotReport | SlotGrant) -> None:
        if isinstance(msg, SlotReport):
            assert to == OWNER
            grant = self.owner.receive(self.now, src, msg, self.policy)
            if grant is not None:
                self.net.append((to, src, grant))
        else:
            self.desks[to].receive(self.now, src, msg, RING)

    @rule(ms=st.sampled_from([1, 2, 5, 10, 20, 50, 150]))
    def advance(self, ms: int) -> None:
        self.now += ms
        for _scope, m in self.owner.tick(self.now):
            if self.held[m]:
                self.exact = False  # a live holder cut off past the member TTL

    @rule(m=st.sampled_from(IDS))
    def crash(self, m: str) -> None:
        self.epochs[m] += 1
        self.desks[m] = SlotDesk(m, self.epochs[m], TIMINGS)
        self.held[m] = set()
        if m == OWNER:
            self.owner = SlotOwner(OWNER, TIMINGS)
            self.exact = False

    @invariant()
    def gauges_match_the_model(self) -> None:
        for m in IDS:
            assert self.desks[m].in_flight(SCOPE) == len(self.held[m])

    @invariant()
    def fleet_within_bound(self) -> None:
        c = self.policy.concurrency
        assert c is not None
        total = sum(len(h) for h in self.held.values())
        bound = global_excess(len(IDS), self.policy.local_burst_cap)
        assert total <= c + bound, (total, c, bound)
        if self.exact:
            assert total <= c, (total, c)


class LocalShareSlots(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.desks = {m: SlotDesk(m, 1, TIMINGS) for m in IDS}
        self.held: dict[str, set[int]] = {m: set() for m in IDS}
        self.n_live = len(IDS)
        self.policy = TenantRatePolicy("t", "inflight", 1, concurrency=5, mode=Mode.SHARE)

    @initialize(cap=st.integers(1, 9), mode=st.sampled_from(["local", "share"]))
    def configure(self, cap: int, mode: str) -> None:
        self.policy = TenantRatePolicy("t", "inflight", 1, concurrency=cap, mode=Mode(mode))

    @rule(m=st.sampled_from(IDS))
    def acquire(self, m: str) -> None:
        v = self.desks[m].acquire(self.policy, 0, self.n_live)
        if v.allowed:
            self.held[m].add(v.lease)

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from([m for m in IDS if self.held[m]]))
        lease = data.draw(st.sampled_from(sorted(self.held[m])))
        assert self.desks[m].release(lease)
        assert not self.desks[m].release(lease)  # twice is a no-op
        self.held[m].discard(lease)

    @invariant()
    def each_worker_within_its_cap(self) -> None:
        c = self.policy.concurrency
        assert c is not None
        cap = c if self.policy.mode == "local" else share_of(c, self.n_live)
        for m in IDS:
            assert len(self.held[m]) <= cap
            assert self.desks[m].in_flight(SCOPE) == len(self.held[m])


TestGlobalSlots = GlobalSlots.TestCase
TestGlobalSlots.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestLocalShareSlots = LocalShareSlots.TestCase
TestLocalShareSlots.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)


def test_slot_messages_round_trip_and_bad_ones_name_the_field() -> None:
    """A peer's slot message is untrusted: every field is checked on decode."""
    import msgpack
    import pytest

    from mesh.core.concurrency import SlotGrants, SlotReports
    from mesh.core.messages import SCHEMA_VERSION, decode, encode
    from mesh.errors import MessageError

    reports = SlotReports("a", 3, (SlotReport(SCOPE, 2, 7, 1, 4, 5),))
    grants = SlotGrants("c", 3, (SlotGrant(SCOPE, 2, 7, 4, 100),))
    assert decode(encode(reports)) == reports and decode(encode(grants)) == grants
    row = ["t", "inflight", 2, 7, 1, 4, 5]
    for bad, field in (
        ([*row[:6], -1], "rows[0][6]"),
        (["t", "Bad Metric", *row[2:]], "rows[0].metric"),
        ([*row[:6], "5"], "rows[0][6]"),
        (row[:6], "rows[0]"),
    ):
        data = msgpack.packb([SCHEMA_VERSION, "slots", "a", 3, [bad]])
        with pytest.raises(MessageError) as err:
            decode(data)
        assert err.value.field == field, err.value
    many = msgpack.packb([SCHEMA_VERSION, "slots", "a", 3, [row] * 257])
    with pytest.raises(MessageError, match="at most 256"):
        decode(many)


def test_an_owner_refuses_implausible_reports_and_changes_nothing() -> None:
    policy = TenantRatePolicy("t", "inflight", 1, concurrency=4, mode=Mode.GLOBAL)
    owner = SlotOwner(OWNER, TIMINGS)
    assert owner.receive(0, "a", SlotReport(SCOPE, 1, 1, 5, 0, 1), policy) is None  # > C
    assert owner.refused == 1 and owner.counted(SCOPE, 0) == 0 and not owner.scopes
    g = owner.receive(0, "a", SlotReport(SCOPE, 1, 1, 0, 0, 3), policy)
    assert g is not None and g.allowance == 3
    assert owner.receive(1, "a", SlotReport(SCOPE, 1, 1, 0, 0, 3), policy) is None  # a replay
    g2 = owner.receive(1, "b", SlotReport(SCOPE, 1, 1, 0, 0, 4), policy)
    assert g2 is not None and g2.allowance == 1  # what a's grant leaves of C


def test_share_decays_to_c_per_worker_when_membership_is_stale_and_says_so() -> None:
    desk = SlotDesk("a", 1, TIMINGS)
    p = TenantRatePolicy("t", "inflight", 1, concurrency=6, mode=Mode.SHARE)
    fresh = [desk.acquire(p, 0, 3) for _ in range(3)]
    assert [v.allowed for v in fresh] == [True, True, False] and fresh[0].cap == 2
    assert fresh[0].bound == "in_flight<=N*ceil(C/N_live)"
    stale = desk.acquire(p, 0, 3, stale=True)
    assert stale.allowed and stale.cap == 6 and stale.bound == "membership_stale:N=1;in_flight<=N*C"


def test_a_grant_overtaken_by_a_later_report_still_counts_until_its_lease_ends() -> None:
    """A grant delayed past the worker's next report is adopted late (it answers a report
    the worker sent); the owner must count it until its lease ends, or it grants the same
    slots twice."""
    policy = TenantRatePolicy("t", "inflight", 1, concurrency=4, mode=Mode.GLOBAL)
    owner = SlotOwner(OWNER, TIMINGS)
    a, b = SlotDesk("a", 1, TIMINGS), SlotDesk("b", 1, TIMINGS)
    for _ in range(4):
        a.acquire(policy, 0, 3)  # demand: 4
    ((_, r1),) = a.tick(0, RING)
    g1 = owner.receive(0, "a", r1, policy)  # 4 for a; delayed on the link
    assert g1 is not None and g1.allowance == 4
    # a reports again before g1 arrives, wanting nothing now (a peer may say anything)
    r2 = SlotReport(SCOPE, 1, r1.seq + 1, 0, 0, 0)
    g2 = owner.receive(5, "a", r2, policy)
    assert g2 is not None and g2.allowance == 0
    b.acquire(policy, 5, 3)
    ((_, rb),) = b.tick(5, RING)
    gb = owner.receive(5, "b", rb, policy)
    assert gb is not None and gb.allowance == 0  # g1 is still a's to spend
    assert a.receive(6, OWNER, g1, RING) and b.receive(6, OWNER, gb, RING)
    held = sum(a.acquire(policy, 6, 3).allowed for _ in range(4))
    held += sum(b.acquire(policy, 6, 3).allowed for _ in range(4))
    assert held <= 4

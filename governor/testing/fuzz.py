"""Randomized invariant checker for the governor engine (seeded, deterministic, replayable).

One seed decides a whole run of random operations against a live engine with a manual clock.
After every step the nine invariants of the spec are checked: I2, I3, I6, I7, I8 from the state,
I9 around every deliberately forbidden call, and I1, I4, I5 by an auditor on each event as it is
emitted. Credit workers (``creditfuzz``) reserve, spend and return blocks beside them, and the
auditor's ledger checks C1-C3 as they go and C4 over the run (``governor.testing.credit``).
Now and then the run restarts (from a snapshot or from the events) and carries on.
At the end the history is replayed three ways (events only, mid-run snapshot + later events,
final snapshot) and each result compared field by field with the live engine.

Run standalone (the mutation check does):
``python -m governor.testing.fuzz --seeds 0:40 --ops 1500``;
exits 1 on the first violation, printing the seed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections.abc import Callable
from typing import Any

from governor.engine import (
    ROOT_ID,
    AdaptiveConfig,
    Consumed,
    Defaults,
    Denial,
    Engine,
    EngineConfig,
    Event,
    Granted,
    InvalidArgument,
    LeaseEnd,
    ManualClock,
    NodeState,
    NotFound,
    OutOfScope,
    Queued,
    Rate,
    Released,
    RequestIdReused,
    SessionEnded,
    SessionState,
)
from governor.testing.checks import Auditor, Violation, canonical, check_state, first_diff
from governor.testing.creditfuzz import CreditWorkers, random_rates

__all__ = ["Run", "Violation", "main", "run_seed"]

RESOURCES = ("http", "retry")
CLASSES = ("db", "api")


class Run:
    def __init__(self, seed: int, ops: int) -> None:
        self.seed = seed
        self.ops = ops
        self.rng = random.Random(seed)
        self.clock = ManualClock(1_000)
        self.auditor = Auditor()
        self.config = EngineConfig(tombstone_ms=60_000, retention_ms=90_000)
        self.engine = Engine(self.clock, self.auditor, self.config)
        self.auditor.engine = self.engine
        self.terminal: dict[int, NodeState] = {}
        self.sessions: list[int] = []
        self.leases: dict[int, int] = {}  # lease id -> session id (ever granted to us)
        self.waiters: dict[int, int] = {}  # waiter id -> session id
        self.requests: list[tuple[int, str, Callable[[], Any], Any]] = []
        self.rid = 0
        self.restarts = 0
        self.workers = CreditWorkers(
            self.rng, self.clock, lambda: self.engine, lambda: self.auditor.credit
        )

    # ---- helpers -----------------------------------------------------------------------

    def open_sessions(self) -> list[int]:
        st = self.engine.state
        return [
            s
            for s in self.sessions
            if s in st.sessions
            and st.sessions[s].state is SessionState.OPEN
            and st.sessions[s].scope_id in st.nodes
        ]

    def in_scope(self, sid: int) -> list[int]:
        scope = self.engine.state.sessions[sid].scope_id
        out = []
        for nid in sorted(self.engine.state.nodes):
            if any(a.id == scope for a in self.engine.state.chain(nid)):
                out.append(nid)
        return out

    def out_of_scope(self, sid: int) -> list[int]:
        inside = set(self.in_scope(sid))
        return [n for n in sorted(self.engine.state.nodes) if n not in inside]

    def caps(self, names: tuple[str, ...], hi: int) -> dict[str, int]:
        """Some caps, rarely zero (a zero limit only parks waiters)."""
        lo = 0 if self.rng.random() < 0.1 else 1
        return {n: self.rng.randint(lo, hi) for n in names if self.rng.random() < 0.5}

    def defaults(self, depth: int = 0) -> Defaults | None:
        if self.rng.random() < 0.4:
            return None
        return Defaults(
            quotas=tuple(sorted(self.caps(RESOURCES, 60).items())),
            limits=tuple(sorted(self.caps(CLASSES, 4).items())),
            weight=self.rng.choice([None, 1, 2, 3]),
            priority=self.rng.choice([None, 0, 1, 5]),
            children=self.defaults(depth + 1) if depth < 2 else None,
        )

    def next_rid(self) -> str | None:
        if self.rng.random() < 0.3:
            self.rid += 1
            return f"r{self.rid}"
        return None

    def token(self) -> str:
        self.rid += 1
        return hashlib.sha256(f"{self.seed}/{self.rid}".encode()).hexdigest()

    # ---- setup and the steps --------------------------------------------------------------

    def setup(self) -> None:
        e = self.engine
        e.set_quota(None, ROOT_ID, "http", 2_000)
        e.set_quota(None, ROOT_ID, "retry", 300)
        e.set_limit(None, ROOT_ID, "db", 6)
        e.set_rate(None, ROOT_ID, "http", Rate(400, 300))
        e.set_adaptive(
            "api",
            AdaptiveConfig(
                initial_limit=5,
                min_limit=1,
                max_limit=8,
                target_p95_ms=50,
                min_samples=3,
                interval_ms=2_000,
            ),
        )
        for i in range(3):
            created = e.create_node(
                None,
                ROOT_ID,
                f"tenant{i}",
                quotas=self.caps(RESOURCES, 900),
                limits=self.caps(CLASSES, 4),
                weight=i + 1,
                defaults=self.defaults(),
                rates=random_rates(self.rng, RESOURCES),
            )
            assert not isinstance(created, Denial)
            self.new_session(created.node_id)
        self.new_session(ROOT_ID)

    def new_session(self, scope: int) -> None:
        ttl_ms = self.rng.choice([2_000, 5_000, 20_000])
        try:
            sid, _ = self.engine.open_session(scope, ttl_ms, self.token())
        except NotFound:  # the node was purged as the call brought time up to date
            sid, _ = self.engine.open_session(ROOT_ID, ttl_ms, self.token())
        self.sessions.append(sid)

    def step(self) -> None:
        roll = self.rng.random()
        table = [
            (0.10, self.op_consume),
            (0.12, self.op_acquire),
            (0.10, self.op_release),
            (0.08, self.op_create),
            (0.09, self.op_clock),
            (0.06, self.op_edit),
            (0.05, self.op_forbidden),
            (0.05, self.op_retry),
            (0.04, self.op_waiters),
            (0.08, self.op_heartbeat),
            (0.03, self.op_end_node),
            (0.03, self.op_sessions),
            (0.02, self.op_validate),
            (0.005, self.op_restart),
            (0.12, self.op_credit),
            (1.00, self.op_tick),
        ]
        acc = 0.0
        for p, op in table:
            acc += p
            if roll < acc:
                op()
                return

    def pick_session(self) -> int | None:
        sessions = self.open_sessions()
        if len(sessions) < 3:
            nodes = sorted(n for n, x in self.engine.state.nodes.items() if x.depth <= 2)
            self.new_session(self.rng.choice(nodes))
            sessions = self.open_sessions()
        return self.rng.choice(sessions) if sessions else None

    def remember(self, sid: int, rid: str | None, call: Callable[[], Any], result: Any) -> None:
        if rid is not None and not isinstance(result, (Denial, Queued)):
            self.requests.append((sid, rid, call, result))

    def op_consume(self) -> None:
        sid = self.pick_session()
        if sid is None:
            return
        node = self.rng.choice(self.in_scope(sid))
        resource = self.rng.choice(RESOURCES)
        amount = self.rng.randint(1, 12)
        st = self.engine.state
        self.engine.tick()
        n = st.nodes.get(node)
        if n is None:
            return
        expect_ok = n.state is NodeState.ACTIVE and all(
            amount <= a.quotas[resource] - a.used.get(resource, 0)
            for a in st.chain(node)
            if resource in a.quotas
        )
        rid = self.next_rid()
        call: Callable[[], Any]
        call = lambda: self.engine.consume(sid, node, resource, amount, request_id=rid)  # noqa: E731
        result = call()
        if isinstance(result, Consumed) != expect_ok:
            raise Violation(f"oracle: consume {node} {resource} {amount} gave {result}")
        self.remember(sid, rid, call, result)

    def op_acquire(self) -> None:
        sid = self.pick_session()
        if sid is None:
            return
        node = self.rng.choice(self.in_scope(sid))
        cls = self.rng.choice(CLASSES)
        rid = self.next_rid()
        wait = self.rng.random() < 0.7
        call: Callable[[], Any]
        call = lambda: self.engine.acquire(sid, node, cls, wait=wait, request_id=rid)  # noqa: E731
        try:
            result = call()
        except NotFound:
            return
        if isinstance(result, Granted):
            self.leases[result.lease_id] = sid
        elif isinstance(result, Queued):
            self.waiters[result.waiter_id] = sid
        self.remember(sid, rid, call, result)

    def op_release(self) -> None:
        if not self.leases:
            return
        lease_id = self.rng.choice(sorted(self.leases))
        sid = self.leases[lease_id]
        if self.rng.random() < 0.1:  # not the owner
            others = [s for s in self.open_sessions() if s != sid]
            if others:
                try:
                    self.engine.release(self.rng.choice(others), lease_id)
                except Exception as exc:  # noqa: BLE001
                    if type(exc).__name__ not in ("NotOwner", "NotFound"):
                        raise
                    return
                raise Violation("release by a non-owner was accepted")
        self.engine.tick()
        now = self.clock.now_ms()
        live = lease_id in self.engine.state.leases
        ended = self.auditor.ended.get(lease_id)
        latency = self.rng.choice([None, 5, 20, 80, 200])
        try:
            result = self.engine.release(
                sid, lease_id, latency_ms=latency, overloaded=self.rng.random() < 0.2
            )
        except NotFound:
            if live or (
                ended
                and ended[1] + self.config.tombstone_ms > now
                and sid in self.engine.state.sessions
            ):
                raise Violation(
                    f"oracle: release of {lease_id} said not found within its tombstone"
                ) from None
            del self.leases[lease_id]
            return
        if live:
            if result != Released(lease_id, LeaseEnd.RELEASED, True):
                raise Violation(f"oracle: release of a live lease gave {result}")
        else:
            assert ended is not None
            if result != Released(lease_id, ended[0], False):
                raise Violation(f"oracle: late release of {lease_id} gave {result}, ended {ended}")

    def op_create(self) -> None:
        sid = self.pick_session()
        if sid is None:
            return
        parent = self.rng.choice(self.in_scope(sid))
        rid = self.next_rid()
        quotas, limits = self.caps(RESOURCES, 80), self.caps(CLASSES, 3)
        weight = self.rng.choice([None, 1, 2])
        deadline = self.rng.choice([None, None, self.clock.now_ms() + self.rng.randint(0, 30_000)])
        defaults = self.defaults()
        rates = random_rates(self.rng, RESOURCES)

        def call() -> Any:
            return self.engine.create_node(
                sid,
                parent,
                "n",
                quotas=quotas,
                limits=limits,
                weight=weight,
                deadline_ms=deadline,
                defaults=defaults,
                request_id=rid,
                rates=rates,
            )

        try:
            result = call()
        except NotFound:
            return
        self.remember(sid, rid, call, result)

    def op_clock(self) -> None:
        if self.rng.random() < 0.04:
            self.clock.advance(self.rng.choice([25_000, 70_000]))
        else:
            self.clock.advance(self.rng.choice([1, 10, 100, 300, 700, 1_500]))

    def editable(self, sid: int) -> list[int]:
        scope = self.engine.state.sessions[sid].scope_id
        return [n for n in self.in_scope(sid) if n != scope]

    def op_edit(self) -> None:
        sid = self.pick_session()
        if sid is None:
            return
        targets = self.editable(sid)
        if not targets:
            return
        node = self.rng.choice(targets)
        rid = self.next_rid()
        kind = self.rng.randrange(6)
        call: Callable[[], Any]
        if kind == 0:
            r, v = self.rng.choice(RESOURCES), self.rng.choice([None, 0, 10, 50, 200])
            call = lambda: self.engine.set_quota(sid, node, r, v, request_id=rid)  # noqa: E731
        elif kind == 1:
            c, v = self.rng.choice(CLASSES), self.rng.choice([None, 0, 1, 2, 4])
            call = lambda: self.engine.set_limit(sid, node, c, v, request_id=rid)  # noqa: E731
        elif kind == 2:
            d = self.defaults()
            call = lambda: self.engine.set_defaults(sid, node, d, request_id=rid)  # noqa: E731
        elif kind == 3:
            w = self.rng.randint(1, 4)
            call = lambda: self.engine.set_weight(sid, node, w, request_id=rid)  # noqa: E731
        elif kind == 4:
            dl = self.rng.choice([None, self.clock.now_ms() + self.rng.randint(0, 20_000)])
            call = lambda: self.engine.set_deadline(sid, node, dl, request_id=rid)  # noqa: E731
        else:
            r = self.rng.choice(RESOURCES)
            rate = random_rates(self.rng, (r,)).get(r)
            call = lambda: self.engine.set_rate(sid, node, r, rate, request_id=rid)  # noqa: E731
        try:
            result = call()
        except NotFound:
            return
        n = self.engine.state.nodes.get(node)
        if n is not None and kind == 0 and n.quotas.get(r) != v:
            raise Violation(f"oracle: set_quota({node}, {r}, {v}) left {n.quotas.get(r)}")
        if n is not None and kind == 1 and n.limits.get(c) != v:
            raise Violation(f"oracle: set_limit({node}, {c}, {v}) left {n.limits.get(c)}")
        self.remember(sid, rid, call, result)

    def op_end_node(self) -> None:
        sid = self.pick_session()
        if sid is None:
            return
        targets = self.editable(sid)
        if targets:
            node = self.rng.choice(targets)
            state = self.rng.choice([NodeState.DONE, NodeState.CANCELLED])
            try:
                self.engine.end_node(sid, node, state)
            except NotFound:  # purged as the call brought time up to date
                pass

    def op_forbidden(self) -> None:
        """I9: a call outside the scope (or an edit of the scope node) changes nothing."""
        self.engine.tick()  # first, so the call itself has no time-driven work to do
        sid = self.pick_session()
        if sid is None:
            return
        self.engine.tick()  # pick_session may have opened a session
        outside = self.out_of_scope(sid)
        scope = self.engine.state.sessions[sid].scope_id
        before, n_events = canonical(self.engine), len(self.auditor.events)
        e = self.engine
        calls: list[Callable[[], Any]] = [
            lambda: e.set_quota(sid, scope, "http", None),
            lambda: e.set_limit(sid, scope, "db", 100),
            lambda: e.set_defaults(sid, scope, Defaults(quotas=(("http", 1),))),
            lambda: e.set_weight(sid, scope, 9),
            lambda: e.end_node(sid, scope, NodeState.CANCELLED),
        ]
        if outside:
            node = self.rng.choice(outside)
            calls += [
                lambda: e.consume(sid, node, "http", 1),
                lambda: e.acquire(sid, node, "db"),
                lambda: e.create_node(sid, node, "x"),
                lambda: e.set_quota(sid, node, "http", 0),
                lambda: e.end_node(sid, node),
                lambda: e.reserve_credit(sid, node, "http", 1),
            ]
        call = self.rng.choice(calls)
        try:
            call()
        except OutOfScope:
            pass
        except InvalidArgument:
            if scope != ROOT_ID:
                raise
        else:
            raise Violation(f"I9: a forbidden call by session {sid} was allowed")
        if canonical(self.engine) != before or len(self.auditor.events) != n_events:
            raise Violation("I9: a forbidden call changed the state")

    def op_retry(self) -> None:
        """Idempotency: the same request id returns the first result and applies nothing."""
        if not self.requests:
            return
        sid, rid, call, result = self.rng.choice(self.requests[-50:])
        st = self.engine.state
        session = st.sessions.get(sid)
        if session is None or session.state is not SessionState.OPEN or rid not in session.memory:
            return
        self.engine.tick()
        n_events = len(self.auditor.events)
        again = call()
        if again != result or len(self.auditor.events) != n_events:
            raise Violation(f"idempotency: retry of {rid} gave {again}, first {result}")
        try:
            self.engine.consume(sid, -1, "http", 1, request_id=rid)
        except RequestIdReused:
            pass
        else:
            raise Violation("idempotency: a reused id with other arguments was accepted")
        if len(self.auditor.events) != n_events:
            raise Violation("idempotency: a reused id changed the state")

    def op_waiters(self) -> None:
        if not self.waiters:
            return
        wid = self.rng.choice(sorted(self.waiters))
        sid = self.waiters.pop(wid)
        try:
            if self.rng.random() < 0.5:
                released = self.engine.cancel_wait(sid, wid)
                if released is not None:
                    self.leases[released.lease_id] = sid
            else:
                out = self.engine.take_outcome(sid, wid)
                if out is None:
                    self.waiters[wid] = sid
                elif isinstance(out, Granted):
                    self.leases[out.lease_id] = sid
        except NotFound:
            pass

    def op_heartbeat(self) -> None:
        """Healthy workers heartbeat; the last session in the list plays a dead worker."""
        for sid in self.open_sessions()[:-1]:
            try:
                self.engine.heartbeat(sid)
            except SessionEnded:
                pass

    def op_sessions(self) -> None:
        roll = self.rng.random()
        open_ = self.open_sessions()
        if roll < 0.5 or len(open_) < 2:
            nodes = sorted(n for n, x in self.engine.state.nodes.items() if x.depth <= 2)
            self.new_session(self.rng.choice(nodes))
        else:
            try:
                self.engine.close_session(self.rng.choice(open_))
            except SessionEnded:
                pass

    def op_validate(self) -> None:
        if self.leases:
            lease_id = self.rng.choice(sorted(self.leases))
            try:
                status = self.engine.validate(lease_id)
            except NotFound:
                return
            if status.live != (lease_id in self.engine.state.leases):
                raise Violation("validate disagrees with the state")

    def op_credit(self) -> None:
        """A credit worker spends, refills or gives back (C1-C4 are checked as it goes)."""
        sid = self.pick_session()
        if sid is None:
            return
        key = self.workers.pick(sid, self.in_scope(sid), RESOURCES)
        roll = self.rng.random()
        if roll < 0.6 and self.workers.holders[key].held(self.clock.now_ms()) > 0:
            self.workers.spend(key)
        elif roll < 0.85:
            self.workers.reserve(key)
        else:
            self.workers.give_back(key)

    def op_tick(self) -> None:
        self.engine.tick()

    def op_restart(self) -> None:
        """Restart is replay: carry on with an engine rebuilt from the record alone."""
        self.engine.tick()
        if self.rng.random() < 0.5:
            snap: dict[str, Any] | None = json.loads(json.dumps(self.engine.snapshot()))
            events: list[Event] = []
        else:
            snap, events = None, list(self.auditor.events)
        before = canonical(self.engine)
        self.engine = Engine.restore(snap, events, self.clock, self.auditor, self.config)
        self.auditor.engine = self.engine
        self.restarts += 1
        if canonical(self.engine) != before:
            raise Violation(
                f"restart changed the state: {first_diff(before, canonical(self.engine))}"
            )

    # ---- the run -----------------------------------------------------------------------

    def run(self) -> None:
        self.setup()
        mid: tuple[dict[str, Any], int] | None = None
        for i in range(self.ops):
            try:
                self.step()
            except SessionEnded:
                pass
            check_state(self.engine, self.auditor, self.terminal)
            if i == self.ops // 2:
                mid = (self.engine.snapshot(), len(self.auditor.events))
        self.engine.tick()
        check_state(self.engine, self.auditor, self.terminal)
        self.auditor.credit.check_envelope()
        assert mid is not None
        self.check_replay(mid)

    def check_replay(self, mid: tuple[dict[str, Any], int]) -> None:
        live = canonical(self.engine)
        final = self.engine.snapshot()
        events = self.auditor.events
        ways = {
            "events only": (None, events),
            "mid snapshot + events": (mid[0], events[mid[1] :]),
            "final snapshot": (final, []),
        }
        for name, (snap, evs) in ways.items():
            sink: list[Event] = []
            snap = json.loads(json.dumps(snap)) if snap is not None else None
            restored = Engine.restore(
                snap, evs, ManualClock(self.clock.now_ms()), sink.append, self.config
            )
            got = canonical(restored)
            if got != live:
                raise Violation(f"replay ({name}) differs from live: {first_diff(live, got)}")


def run_seed(seed: int, ops: int = 1500) -> None:
    try:
        Run(seed, ops).run()
    except Exception as exc:
        raise Violation(f"seed {seed} (ops={ops}): {type(exc).__name__}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="0:40", help="start:stop")
    parser.add_argument("--ops", type=int, default=1500)
    args = parser.parse_args(argv)
    start, stop = (int(x) for x in args.seeds.split(":"))
    for seed in range(start, stop):
        try:
            run_seed(seed, args.ops)
        except Violation as exc:
            print(f"FAIL {exc}", flush=True)
            return 1
    print(f"ok seeds {start}:{stop} ops {args.ops}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Engines standing in for governord processes on one database, for checker tests.

``Db`` is the shared record (the event log and the leadership epoch, as PostgreSQL would
hold them); a ``Leader`` takes over by bumping the epoch and replaying the log into an
``Engine``, then serves calls, committing each call's events only if its epoch is still
the database's (a deposed leader's commit fails: it stops, its callers learn nothing).
Two planted bugs switch parts of that off: ``check_epoch=False`` (a commit that skips the
epoch check) and ``replay=k`` (a standby that serves after replaying only k events).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from governor.engine import (
    ROOT_ID,
    Engine,
    EngineConfig,
    Event,
    ManualClock,
    Rate,
)
from governor.testing.linearizability import History, Op, engine_call, tree_of
from governor.testing.linearizability._engine import Answer

NS_PER_MS = 1_000_000
CONFIG = EngineConfig(credit_ttl_ms=20)


@dataclass
class Db:
    events: list[Event] = field(default_factory=list)
    epoch: int = 0


class Leader:
    def __init__(
        self,
        db: Db,
        clock: ManualClock,
        *,
        check_epoch: bool = True,
        replay: int | None = None,
    ) -> None:
        db.epoch += 1
        self.db, self.epoch, self.check_epoch = db, db.epoch, check_epoch
        self.pending: list[Event] = []
        log = db.events if replay is None else db.events[:replay]
        self.engine = Engine.restore(None, list(log), clock, self.pending.append, CONFIG)
        self.alive = True

    def call(self, session_id: int, call: str, args: Mapping[str, Any]) -> Answer | None:
        """The answer, or None if this process stopped (a failed commit) or had stopped."""
        if not self.alive:
            return None
        answer = engine_call(self.engine, session_id, call, args)
        deposed = self.db.epoch != self.epoch
        if deposed and self.check_epoch:
            self.alive = False  # the commit (or the epoch confirmation of a read) failed
            self.pending.clear()
            return None
        if not deposed:
            self.db.events.extend(self.pending)
        # deposed without the check: "committed" where no leader replays it, and answered
        self.pending.clear()
        return answer

    def setup(self, fn: Any) -> Any:
        """An operator step (the tree, sessions), committed like any other."""
        out = fn(self.engine)
        self.db.events.extend(self.pending)
        self.pending.clear()
        return out


def build_tree(leader: Leader, sessions: int) -> list[int]:
    """root(1): db 3, http 30 > tenant 2: http 12, db 2, tok 8/s burst 8 > task 4: http 5,
    db 1; tenant 3: http 10, tok burst 5. Returns the open sessions (scope: the root)."""

    def make(e: Engine) -> list[int]:
        e.set_limit(None, ROOT_ID, "db", 3)
        e.set_quota(None, ROOT_ID, "http", 30)
        e.create_node(
            None, ROOT_ID, "a", quotas={"http": 12}, limits={"db": 2}, rates={"tok": Rate(8, 8)}
        )
        e.create_node(None, ROOT_ID, "b", quotas={"http": 10}, rates={"tok": Rate(5, 5)})
        e.create_node(None, 2, "task", quotas={"http": 5}, limits={"db": 1})
        return [e.open_session(ROOT_ID, 10**9, f"{i:064x}")[0] for i in range(sessions)]

    out: list[int] = leader.setup(make)
    return out


class Recording:
    """Calls through leaders into a history, each at the manual clock's instant, with an
    interval of ``[now - before_ns, now + after_ns]`` (so intervals overlap)."""

    def __init__(self, clock: ManualClock, leader: Leader) -> None:
        self.clock = clock
        self.history = History(tree_of(leader.engine), lease_expiry=False)
        self.tick = 0

    def point_ns(self) -> int:
        self.tick += 1
        return self.clock.now_ms() * NS_PER_MS + self.tick * 10

    def add(
        self,
        leader: Leader | None,
        client: str,
        session_id: int,
        call: str,
        args: Mapping[str, Any],
        *,
        before_ns: int = 0,
        after_ns: int = 1,
        lose: bool = False,
    ) -> Answer | None:
        """Run the call (unless ``leader`` is None: it never arrived) and record it; a call
        whose answer is lost (``lose``, or the leader stopped) is unknown."""
        at = self.point_ns()
        answer = None if leader is None else leader.call(session_id, call, args)
        inv = max(0, at - before_ns)
        if answer is None or lose:
            self.history.add(Op(0, client, call, dict(args), inv, None, "unknown"))
            return None
        outcome, result, error = answer
        self.history.add(
            Op(0, client, call, dict(args), inv, at + after_ns, outcome, result, error)
        )
        return answer

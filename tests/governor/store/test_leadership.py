"""Leadership on a shared PostgreSQL record: the leader row, its epoch in every commit, the
takeover rules (a gone backend at once, a live one only past its lease), and a standby's tail."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from governor.authority import Authority
from governor.engine import ROOT_ID, ManualClock
from governor.store import Batch, CommitFailed, Deposed, EventLog, PostgresBackend
from tests.governor._stores import StoreTarget, make_target

pytestmark = pytest.mark.postgres

LEASE_MS = 300
EMPTY = Batch([], [], [], None)  # a commit that only renews (or is refused)


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[StoreTarget]:
    yield from make_target("postgres", tmp_path)


def _backend(pg: StoreTarget) -> PostgresBackend:
    b = pg.backend()
    assert isinstance(b, PostgresBackend)
    b.migrate()
    return b


def test_first_leader_gets_epoch_1_and_a_live_one_is_not_taken(pg: StoreTarget) -> None:
    a, b = _backend(pg), _backend(pg)
    try:
        assert a.try_lead("a", "127.0.0.1:1", LEASE_MS) == 1
        row = b.leader()
        assert row is not None
        assert (row.epoch, row.holder, row.address, row.alive) == (1, "a", "127.0.0.1:1", True)
        assert not row.takeable
        assert b.try_lead("b", "127.0.0.1:2", LEASE_MS) is None
        assert b.epoch is None
    finally:
        a.close()
        b.close()


def test_a_gone_leader_is_replaced_at_once_and_its_epoch_refused(pg: StoreTarget) -> None:
    a, b = _backend(pg), _backend(pg)
    try:
        assert a.try_lead("a", "x:1", 60_000) == 1  # a long lease: only the backend check fires
        a._conn.close()  # the process died: its connection is gone
        assert b.try_lead("b", "x:2", 60_000) == 2
        row = b.leader()
        assert row is not None and (row.epoch, row.holder) == (2, "b")
        stale = _backend(pg)
        stale.epoch = 1  # what a deposed leader's commit carries
        with pytest.raises(Deposed, match="epoch 1.*deposed.*epoch 2 at x:2"):
            stale.commit(EMPTY)
        stale.close()
    finally:
        b.close()


def test_a_live_leader_past_its_lease_is_taken_and_its_backend_ended(pg: StoreTarget) -> None:
    a, b = _backend(pg), _backend(pg)
    try:
        assert a.try_lead("a", "x:1", LEASE_MS) == 1
        assert b.try_lead("b", "x:2", LEASE_MS) is None
        time.sleep(LEASE_MS / 1000 + 0.2)  # a stops renewing (a pause, a partition)
        assert b.try_lead("b", "x:2", LEASE_MS) == 2
        with pytest.raises(CommitFailed):  # its connection was terminated, and its epoch is old
            a.commit(EMPTY)
    finally:
        b.close()
        a._conn.close()


def test_step_down_hands_over_at_once(pg: StoreTarget) -> None:
    a, b = _backend(pg), _backend(pg)
    try:
        assert a.try_lead("a", "x:1", 60_000) == 1
        a.close()  # a clean stop gives the row up
        assert b.try_lead("b", "x:2", 60_000) == 2
    finally:
        b.close()


def test_an_idle_leader_renews_and_rounds_confirm(pg: StoreTarget) -> None:
    a = _backend(pg)
    assert a.try_lead("a", "x:1", LEASE_MS) == 1
    log = EventLog(a)
    log.load()
    log.fence(renew_every_s=0.05, lease_s=LEASE_MS / 1000)
    log.start()
    watcher = _backend(pg)
    try:
        time.sleep(LEASE_MS / 1000 * 2)
        row = watcher.leader()
        assert row is not None and row.renewed_age_ms < LEASE_MS  # renewed while idle
        want = log.want_round()
        assert want > 0
        end = time.monotonic() + 5
        while log.rounds_done < want and time.monotonic() < end:
            time.sleep(0.005)
        assert log.rounds_done >= want
    finally:
        log.close()
        watcher.close()


def test_a_commit_stuck_past_the_lease_stops_the_leader(pg: StoreTarget) -> None:
    """The leader row is locked by another transaction (as a partition leaves a commit
    hanging): past the lease the watchdog calls on_fatal instead of waiting forever."""
    a = _backend(pg)
    assert a.try_lead("a", "x:1", LEASE_MS) == 1
    fatal: list[BaseException] = []
    got = threading.Event()

    def on_fatal(exc: BaseException) -> None:
        fatal.append(exc)
        got.set()

    log = EventLog(a, on_fatal=on_fatal)
    log.load()
    log.fence(renew_every_s=0.05, lease_s=LEASE_MS / 1000)
    blocker = psycopg.connect(pg.target, autocommit=False)
    try:
        blocker.execute(f'SELECT * FROM "{pg.schema}".leader FOR UPDATE')
        log.start()
        assert got.wait(10)
        assert isinstance(fatal[0], Deposed)
        assert "leader lease" in str(fatal[0])
    finally:
        blocker.rollback()
        blocker.close()
        log._closing = True
        a._conn.close()


def test_a_standby_tails_the_record_and_takes_over_with_all_of_it(pg: StoreTarget) -> None:
    a = _backend(pg)
    assert a.try_lead("a", "x:1", LEASE_MS) == 1
    leader = Authority(EventLog(a), clock=ManualClock(1_000), snapshot_every=10_000)
    standby_log = EventLog(_backend(pg))
    tail = standby_log.load()
    try:
        for i in range(5):
            name = f"r{i}"
            leader.call(lambda e: e.set_quota(None, ROOT_ID, name, 10, None))  # noqa: B023
        tail = standby_log.load(tail)  # only what is new
        assert tail.last_seq == leader.engine.last_seq
        leader.snapshot_now()  # a snapshot replaces the events it covers: read it all again
        leader.call(lambda e: e.set_quota(None, ROOT_ID, "late", 1, None))
        tail = standby_log.load(tail)
        assert tail.snapshot is not None and tail.last_seq == leader.engine.last_seq
        expected = leader.engine.snapshot()
    finally:
        leader.close()  # steps down
    b = standby_log.backend
    assert isinstance(b, PostgresBackend)
    assert b.try_lead("b", "x:2", LEASE_MS) == 2
    tail = standby_log.load(tail)
    follower = Authority(standby_log, clock=ManualClock(1_000), loaded=tail)
    try:
        got = follower.engine.snapshot()
        assert got["seq"] == expected["seq"]
        assert got["nodes"] == expected["nodes"]
    finally:
        follower.close()


def test_a_leader_paused_inside_a_commit_is_taken_over_past_its_lease(pg: StoreTarget) -> None:
    """The leader stopped between its commit's first statement and the end (SIGSTOP, a
    partition): its transaction holds the row. The standby ends that backend and takes it."""
    a, b = _backend(pg), _backend(pg)
    try:
        assert a.try_lead("a", "x:1", LEASE_MS) == 1
        a._conn.execute("BEGIN")
        a._fence(a._conn.cursor(), 1)  # holds the leader row, never commits
        time.sleep(LEASE_MS / 1000 + 0.2)
        end = time.monotonic() + 10
        epoch = None
        while epoch is None and time.monotonic() < end:
            epoch = b.try_lead("b", "x:2", LEASE_MS)
        assert epoch == 2
        with pytest.raises(psycopg.Error):  # its backend was ended: the commit rolled back
            a._conn.execute("COMMIT")
    finally:
        b.close()
        a._conn.close()

"""Write before reply, through the real engine and a real SQLite log."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from governor.authority import Authority
from governor.engine import ROOT_ID, Consumed, Granted, ManualClock
from governor.store import Batch, CommitFailed, EventLog, SqliteBackend


class GatedBackend(SqliteBackend):
    """A real SQLite backend whose commits wait for the test to open a gate."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.gate.set()

    def commit(self, batch: Batch) -> None:
        self.gate.wait()
        super().commit(batch)


def _token(i: int) -> str:
    return hashlib.sha256(b"%d" % i).hexdigest()


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


def test_no_reply_before_its_events_and_every_earlier_event_are_committed(tmp_path: Path) -> None:
    backend = GatedBackend(str(tmp_path / "g.db"))
    authority = Authority(EventLog(backend), clock=ManualClock(0))
    sid, _ = authority.call(lambda e: e.open_session(ROOT_ID, 10**6, _token(1)))
    node = authority.call(lambda e: e.create_node(None, ROOT_ID, "t")).node_id  # type: ignore[union-attr]
    backend.gate.clear()
    writer, got = _in_thread(lambda: authority.call(lambda e: e.consume(sid, node, "http", 1)))
    writer.join(0.3)
    assert writer.is_alive() and not got  # applied in memory, not yet on record: no reply
    assert authority.engine.state.nodes[node].used["http"] == 1
    # a read that saw that state also waits: no caller is ever ahead of the record
    reader, seen = _in_thread(lambda: authority.call(lambda e: e.state.nodes[node].used["http"]))
    reader.join(0.3)
    assert reader.is_alive() and not seen
    backend.gate.set()
    writer.join()
    reader.join()
    assert isinstance(got[0], Consumed) and seen == [1]
    assert authority.log.committed_seq == authority.engine.last_seq
    authority.close()


def test_a_failed_commit_fails_every_waiter_and_never_rolls_memory_back(tmp_path: Path) -> None:
    fatal: list[BaseException] = []
    backend = SqliteBackend(str(tmp_path / "g.db"))
    authority = Authority(EventLog(backend, on_fatal=fatal.append), clock=ManualClock(0))
    sid, _ = authority.call(lambda e: e.open_session(ROOT_ID, 10**6, _token(1)))
    backend._conn.close()  # the database goes away under the writer
    with pytest.raises(CommitFailed):
        authority.call(lambda e: e.consume(sid, ROOT_ID, "http", 1))
    assert len(fatal) == 1 and isinstance(fatal[0], CommitFailed)
    assert authority.engine.state.nodes[ROOT_ID].used["http"] == 1  # memory stays ahead
    with pytest.raises(CommitFailed):
        authority.call(lambda e: e.consume(sid, ROOT_ID, "http", 1))


def test_the_reaper_expires_sessions_without_any_call(tmp_path: Path) -> None:
    clock = ManualClock(0)
    authority = Authority(EventLog(SqliteBackend(str(tmp_path / "g.db"))), clock=clock)
    sid, _ = authority.call(lambda e: e.open_session(ROOT_ID, 100, _token(1)))
    clock.advance(100)
    authority.start_reaper(0.01)
    done = threading.Event()

    def expired() -> bool:
        return authority.engine.state.sessions[sid].state.value == "expired"

    for _ in range(500):
        if expired():
            break
        done.wait(0.01)
    assert expired()
    authority.close()


def _limited(tmp_path: Path, clock: ManualClock) -> tuple[Authority, int, int, int]:
    authority = Authority(EventLog(SqliteBackend(str(tmp_path / "g.db"))), clock=clock)
    authority.call(lambda e: e.set_limit(None, ROOT_ID, "db", 1))
    a, _ = authority.call(lambda e: e.open_session(ROOT_ID, 10**6, _token(1)))
    b, _ = authority.call(lambda e: e.open_session(ROOT_ID, 10**6, _token(2)))
    node = authority.call(lambda e: e.create_node(None, ROOT_ID, "t")).node_id  # type: ignore[union-attr]
    return authority, a, b, node


def test_a_queued_acquire_waits_for_a_release_and_its_record(tmp_path: Path) -> None:
    authority, a, b, node = _limited(tmp_path, ManualClock(0))
    first = authority.acquire(a, node, "db")
    assert isinstance(first, Granted)
    waiter, got = _in_thread(lambda: authority.acquire(b, node, "db"))
    waiter.join(0.2)
    assert waiter.is_alive()  # queued: the pool is full
    authority.call(lambda e: e.release(a, first.lease_id))
    waiter.join()
    assert isinstance(got[0], Granted) and got[0].lease_id > first.lease_id
    assert authority.log.committed_seq == authority.engine.last_seq  # the grant is on record
    authority.close()


def test_an_acquire_that_times_out_leaks_no_lease(tmp_path: Path) -> None:
    authority, a, b, node = _limited(tmp_path, ManualClock(0))
    first = authority.acquire(a, node, "db")
    assert isinstance(first, Granted)
    assert authority.acquire(b, node, "db", timeout_s=0.05) is None
    assert authority.engine.queued() == []
    authority.call(lambda e: e.release(a, first.lease_id))
    assert authority.engine.state.leases == {}
    authority.close()

"""The durable record, the same suite against SQLite and the real PostgreSQL."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.authority import Authority
from governor.engine import (
    ROOT_ID,
    Consumed,
    Engine,
    LogGap,
    ManualClock,
    SnapshotMismatch,
    UnknownEventKind,
)
from governor.store import EventLog
from governor.testing.checks import canonical
from governor.testing.fuzz import Run
from tests.governor._stores import StoreTarget, make_target

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreTarget]:
    yield from make_target(request.param, tmp_path)


def _token(i: int) -> str:
    return hashlib.sha256(b"t%d" % i).hexdigest()


def _fuzzed_log(store: StoreTarget, seed: int, ops: int, snapshot_at: int | None) -> Run:
    """A randomized history written through the log, optionally with a snapshot mid-way."""
    run = Run(seed, ops)
    run.run()
    log = EventLog(store.backend())
    log.load()
    log.start()
    events = run.auditor.events
    replay = Engine(ManualClock(0), lambda e: None, run.config)
    for event in events:
        replay.state.apply(event)
        log.append(event)
        if snapshot_at is not None and event.seq == snapshot_at:
            log.append_snapshot(event.seq, replay.snapshot())
    log.wait(events[-1].seq)
    log.close()
    return run


def _refuses(store: StoreTarget, error: type[Exception], match: str | None = None) -> None:
    backend = store.backend()
    try:
        with pytest.raises(error, match=match):
            EventLog(backend).load()
    finally:
        backend.close()


def test_migrations_are_idempotent(store: StoreTarget) -> None:
    for _ in range(2):
        backend = store.backend()
        assert backend.migrate() == (2 if store.kind == "postgres" else 1)  # + the leader row
        backend.close()


@pytest.mark.parametrize("snapshot", [False, True])
def test_record_round_trips_to_the_live_state(store: StoreTarget, snapshot: bool) -> None:
    run = _fuzzed_log(store, seed=7, ops=600, snapshot_at=150 if snapshot else None)
    # The snapshot needs a history past it; how many events 400 operations make depends on
    # the engine's decisions (e.g. the adaptive controller), so say so if it falls short.
    assert run.auditor.events[-1].seq > 150, "seed 7 made too short a history: raise ops"
    log = EventLog(store.backend())
    loaded = log.load()
    if snapshot:
        assert loaded.snapshot is not None and loaded.snapshot["seq"] == 150
        assert loaded.events[0].seq == 151  # the covered events were deleted with it
    else:
        assert loaded.snapshot is None and loaded.events[0].seq == 1
    restored = Engine.restore(
        loaded.snapshot,
        loaded.events,
        ManualClock(run.clock.now_ms()),
        lambda e: None,
        run.config,
    )
    run.engine.tick()
    assert canonical(restored) == canonical(run.engine)
    log.backend.close()


def test_a_gap_refuses_to_load(store: StoreTarget) -> None:
    _fuzzed_log(store, seed=3, ops=150, snapshot_at=None)
    store.execute("DELETE FROM {t}events WHERE seq = %s", (10,))
    _refuses(store, LogGap, match="expected seq 10")


def test_an_unknown_event_kind_refuses_to_load(store: StoreTarget) -> None:
    _fuzzed_log(store, seed=3, ops=150, snapshot_at=None)
    store.execute("UPDATE {t}events SET kind = 'Teleported' WHERE seq = %s", (5,))
    _refuses(store, UnknownEventKind, match="Teleported")


def test_a_snapshot_that_does_not_fit_refuses_to_load(store: StoreTarget) -> None:
    _fuzzed_log(store, seed=3, ops=200, snapshot_at=20)
    store.execute("UPDATE {t}snapshot SET seq = %s", (19,))
    _refuses(store, SnapshotMismatch)


def test_a_snapshot_with_covered_events_left_refuses_to_load(
    store: StoreTarget,
) -> None:
    _fuzzed_log(store, seed=3, ops=200, snapshot_at=20)
    store.execute("INSERT INTO {t}events (seq, kind, payload) VALUES (%s, 'Charged', '{}')", (20,))
    _refuses(store, SnapshotMismatch, match="covered")


def test_everything_pending_is_committed_as_one_transaction(store: StoreTarget) -> None:
    log = EventLog(store.backend())
    log.load()
    clock = ManualClock(0)
    engine = Engine(clock, log.append)
    for i in range(50):
        engine.open_session(ROOT_ID, 1000, _token(i))
    log.start()  # the writer starts with 50 events pending
    log.wait(50)
    assert log.batches == 1
    log.close()


def test_tokens_are_stored_as_hashes_and_dropped_with_the_session(
    store: StoreTarget,
) -> None:
    authority = Authority(EventLog(store.backend()), clock=ManualClock(0))
    sid, _ = authority.call(lambda e: e.open_session(ROOT_ID, 1000, _token(1)))
    backend = authority.log.backend
    assert backend.token_session(_token(1)) == sid
    authority.call(lambda e: e.close_session(sid))
    assert backend.token_session(_token(1)) is None
    authority.close()


def test_concurrent_callers_hear_back_only_after_commit(store: StoreTarget) -> None:
    """Every acknowledged consume is on record after a clean restart (and nothing more)."""
    authority = Authority(EventLog(store.backend()), snapshot_every=97)
    node = authority.call(lambda e: e.create_node(None, ROOT_ID, "t")).node_id  # type: ignore[union-attr]
    acked = [0] * 8

    def worker(i: int) -> None:
        sid, _ = authority.call(lambda e: e.open_session(ROOT_ID, 10**9, _token(i)))
        for _ in range(60):
            result = authority.call(lambda e: e.consume(sid, node, "http", 1))
            assert isinstance(result, Consumed)
            assert authority.log.committed_seq >= 1
            acked[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    authority.close()
    again = Authority(EventLog(store.backend()))
    assert again.engine.state.nodes[node].used["http"] == sum(acked) == 480
    again.close()

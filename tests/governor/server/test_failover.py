"""Leader and standbys on one PostgreSQL record, as real processes: a standby names the leader,
takes over when the leader is SIGKILLed, paused past its lease or stopped, and serves the
whole record (sessions, leases, request ids) from the same replay path as a restart."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from tests.governor._daemon import KEYS, Daemon, Raw, free_port, wait_until
from tests.governor._stores import make_target

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

A = KEYS["KEY_A"]
HA = {"lease_ms": 600, "renew_ms": 100}
TAKEOVER_S = 5.0  # generous: the machine is shared; the bench reports the real figures


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    for store in make_target("postgres", tmp_path):
        ds = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            d = Daemon(tmp_path / name, store, ha=HA, metrics=f"127.0.0.1:{free_port()}")
            ds.append(d)
        try:
            ds[0].start()
            ds[1].start()
            yield ds[0], ds[1]
        finally:
            for d in ds:
                d.close()


def _health(d: Daemon) -> tuple[int, dict[str, Any]]:
    url = f"http://{d.config['metrics']}/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _leads(raw: Raw, token: str) -> bool:
    reply, _code, _detail = raw("Heartbeat", {}, token=token, timeout=2)
    return reply is not None


def test_a_standby_names_the_leader_and_takes_over_a_killed_one(
    pair: tuple[Daemon, Daemon],
) -> None:
    a, b = pair
    ra, rb = Raw(a.addr), Raw(b.addr)
    opened = ra.ok("OpenSession", {"ttl_ms": 10_000}, key=A)
    token, scope = opened["token"], opened["scope_id"]
    reply, code, detail = rb("Heartbeat", {}, token=token)
    assert reply is None and code is grpc.StatusCode.UNAVAILABLE
    assert detail["reason"] == "not_leader" and detail["leader"] == a.addr
    assert detail["epoch"] == 1
    status, report = _health(b)
    assert status == 503 and report["role"] == "standby" and report["live"] is True
    assert report["checks"]["leader"]["leader"] == a.addr
    status, report = _health(a)
    assert status == 200 and report["role"] == "leader"
    lease = ra.ok("Acquire", {"node_id": scope, "cls": "db", "request_id": "acq-1"}, token=token)
    ra.ok("Consume", {"node_id": scope, "resource": "http", "request_id": "c-1"}, token=token)

    killed = time.monotonic()
    a.kill()
    assert wait_until(lambda: _leads(rb, token), TAKEOVER_S)
    took = time.monotonic() - killed
    assert took < TAKEOVER_S
    # the session, the lease and the request ids came over with the record
    live = rb.ok("Validate", {"lease_id": lease["lease_id"]}, token=token)
    assert live["live"] is True
    rb.ok("Consume", {"node_id": scope, "resource": "http", "request_id": "c-1"}, token=token)
    again = rb.ok("Acquire", {"node_id": scope, "cls": "db", "request_id": "acq-1"}, token=token)
    assert again["lease_id"] == lease["lease_id"]  # a resend straddling the takeover: once
    node = rb.ok("GetNode", {"node_id": scope}, token=token)
    assert node["used"]["http"] == 1
    status, report = _health(b)
    assert status == 200 and report["role"] == "leader"
    assert report["checks"]["leader"]["epoch"] == 2

    a.start()  # the old leader comes back as a standby of the new one
    _, code, detail = ra("Heartbeat", {}, token=token)
    assert code is grpc.StatusCode.UNAVAILABLE and detail["leader"] == b.addr
    ra.close()
    rb.close()


def test_a_paused_leader_is_deposed_and_stops_with_status_70(
    pair: tuple[Daemon, Daemon],
) -> None:
    a, b = pair
    ra, rb = Raw(a.addr), Raw(b.addr)
    token = ra.session(A, ttl_ms=30_000)
    a.signal(signal.SIGSTOP)  # alive, connected, silent: only its lease can end it
    try:
        assert wait_until(lambda: _leads(rb, token), TAKEOVER_S + HA["lease_ms"] / 1000)
    finally:
        a.signal(signal.SIGCONT)
    assert a.proc is not None
    assert a.proc.wait(10) == 70  # its next commit found its epoch taken
    assert "deposed" in a.stderr() or "terminating connection" in a.stderr()
    assert _leads(rb, token)
    ra.close()
    rb.close()


def test_a_stopped_leader_hands_over_at_once(pair: tuple[Daemon, Daemon]) -> None:
    a, b = pair
    ra, rb = Raw(a.addr), Raw(b.addr)
    token = ra.session(A, ttl_ms=30_000)
    assert a.stop() == 0  # SIGTERM: drain, then give the leader row up
    stopped = time.monotonic()
    assert wait_until(lambda: _leads(rb, token), TAKEOVER_S)
    assert time.monotonic() - stopped < TAKEOVER_S
    ra.close()
    rb.close()


def test_a_standby_that_loses_its_database_stops_with_status_70(
    pair: tuple[Daemon, Daemon],
) -> None:
    a, b = pair
    store = b.store
    with psycopg.connect(store.target, autocommit=True) as conn:
        row = conn.execute(f'SELECT pid FROM "{store.schema}".leader').fetchone()
        assert row is not None
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> %s",
            (f"governord-{store.schema}", row[0]),
        )
    assert b.proc is not None
    assert b.proc.wait(15) == 70
    assert "cannot take part in the election" in b.stderr()
    assert "Traceback" not in b.stderr()
    token = Raw(a.addr).session(A)
    assert _leads(Raw(a.addr), token)  # the leader is untouched

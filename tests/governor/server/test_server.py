"""governord end to end: real gRPC on loopback against a real governord process per store.

Every call and every status code; scope isolation; forged and expired tokens; malformed
messages; in-flight idempotency; bare-API-key request ids across a restart.
"""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest

from governor import wire
from tests.governor._daemon import KEYS, Daemon, Raw, wait_until

pytestmark = pytest.mark.slow  # every test runs a real governord

A, B = KEYS["KEY_A"], KEYS["KEY_B"]
C = grpc.StatusCode


def test_every_call_and_status_code(daemon: Daemon, raw: Raw) -> None:
    opened = raw.ok("OpenSession", {"ttl_ms": 5000}, key=A)
    tok, scope = opened["token"], opened["scope_id"]
    assert len(tok) >= 22 and opened["tenant"] == "a"  # >= 128 random bits
    assert raw.ok("Heartbeat", {}, token=tok)["expires_ms"] > 0
    node = raw.ok("CreateNode", {"name": "job", "quotas": {"http": 3}}, token=tok)["node_id"]
    again = raw.ok("EnsureNode", {"name": "job"}, token=tok)
    assert again == {"node_id": node, "created": False}
    info = raw.ok("GetNode", {"node_id": node}, token=tok)
    assert info["parent_id"] == scope and info["quotas"] == {"http": 3}
    # consume: OK, then a denial with its details
    raw.ok("Consume", {"node_id": node, "resource": "http", "amount": 2}, token=tok)
    _, code, detail = raw("Consume", {"node_id": node, "resource": "http", "amount": 2}, token=tok)
    assert code is C.RESOURCE_EXHAUSTED
    assert detail["reason"] == "denied"
    assert detail["denial"] == {
        "reason": "quota",
        "node_id": node,
        "resource": "http",
        "used": 2,
        "limit": 3,
        "requested": 2,
        "top_consumer": node,
    }
    # leases: acquire, validate, release (twice: the second is a no-op), timeout
    lease = raw.ok("Acquire", {"node_id": node, "cls": "db"}, token=tok)["lease_id"]
    assert raw.ok("Validate", {"lease_id": lease}, token=tok)["live"] is True
    rel = raw.ok("Release", {"lease_id": lease, "latency_ms": 5, "overloaded": False}, token=tok)
    assert rel["released"] is True
    assert raw.ok("Release", {"lease_id": lease}, token=tok)["released"] is False
    assert raw.ok("Validate", {"lease_id": lease}, token=tok) == {
        "lease_id": lease,
        "live": False,
        "end": "released",
    }
    raw.ok("SetLimit", {"node_id": node, "cls": "db", "limit": 1}, token=tok)
    held = raw.ok("Acquire", {"node_id": node, "cls": "db"}, token=tok)["lease_id"]
    _, code, detail = raw("Acquire", {"node_id": node, "cls": "db", "timeout_ms": 100}, token=tok)
    assert code is C.DEADLINE_EXCEEDED and detail["reason"] == "timeout"
    raw.ok("Release", {"lease_id": held}, token=tok)
    # edits
    raw.ok("SetQuota", {"node_id": node, "resource": "http", "limit": 10}, token=tok)
    raw.ok("SetDefaults", {"node_id": node, "defaults": {"quotas": {"http": 1}}}, token=tok)
    child = raw.ok("CreateNode", {"name": "c", "parent_id": node}, token=tok)["node_id"]
    assert raw.ok("GetNode", {"node_id": child}, token=tok)["quotas"] == {"http": 1}
    _, code, detail = raw("SetQuota", {"node_id": scope, "resource": "http", "limit": 5}, token=tok)
    assert code is C.PERMISSION_DENIED and detail["reason"] == "out_of_scope"
    # request id reused with other arguments
    body = {"node_id": node, "resource": "http", "request_id": "r-1"}
    raw.ok("Consume", body, token=tok)
    assert raw("Consume", {**body, "amount": 2}, token=tok)[1] is C.ALREADY_EXISTS
    # not found
    _, code, detail = raw("GetNode", {"node_id": 10_000}, token=tok)
    assert code is C.NOT_FOUND and detail["reason"] == "not_found"
    # watch: the current state, then the end
    stream = raw.channel.unary_stream(wire.path("WatchNode"))
    call = stream(wire.pack({"v": 1, "node_id": child}), metadata=[(wire.TOKEN_MD, tok)])
    first = wire.unpack(next(iter(call)))
    assert first["state"] == "active"
    raw.ok("CancelNode", {"node_id": child}, token=tok)
    states = [wire.unpack(m)["state"] for m in call]
    assert states[-1] == "cancelled"
    # an ended node: FAILED_PRECONDITION with the denial
    raw.ok("CloseNode", {"node_id": node}, token=tok)
    _, code, detail = raw("Consume", {"node_id": node, "resource": "http"}, token=tok)
    assert code is C.FAILED_PRECONDITION and detail["denial"]["reason"] == "node_ended"
    assert raw.ok("GetNode", {"node_id": node}, token=tok)["state"] == "done"
    # close the session: its token stops working
    raw.ok("CloseSession", {}, token=tok)
    _, code, detail = raw("Heartbeat", {}, token=tok)
    assert code is C.UNAUTHENTICATED and detail["reason"] == "session_ended"


def test_scope_isolation_changes_nothing(daemon: Daemon, raw: Raw) -> None:
    ta, tb = raw.session(A), raw.session(B)
    nb = raw.ok("CreateNode", {"name": "b-job", "quotas": {"http": 5}}, token=tb)["node_id"]
    raw.ok("Consume", {"node_id": nb, "resource": "http"}, token=tb)
    before = raw.ok("GetNode", {"node_id": nb}, token=tb)
    lease_b = raw.ok("Acquire", {"node_id": nb, "cls": "db"}, token=tb)["lease_id"]
    attempts = [
        ("Consume", {"node_id": nb, "resource": "http"}),
        ("GetNode", {"node_id": nb}),
        ("CreateNode", {"name": "x", "parent_id": nb}),
        ("EnsureNode", {"name": "x", "parent_id": nb}),
        ("CancelNode", {"node_id": nb}),
        ("CloseNode", {"node_id": nb}),
        ("Acquire", {"node_id": nb, "cls": "db"}),
        ("SetQuota", {"node_id": nb, "resource": "http", "limit": 100}),
        ("SetLimit", {"node_id": nb, "cls": "db", "limit": 100}),
        ("SetDefaults", {"node_id": nb, "defaults": {}}),
    ]
    for method, body in attempts:
        _, code, _ = raw(method, body, token=ta)
        assert code is C.PERMISSION_DENIED, method
        _, code, _ = (
            raw(method, body, key=A) if method in ("Consume", "EnsureNode") else (0, code, 0)
        )
        assert code is C.PERMISSION_DENIED, method
    _, code, detail = raw("Release", {"lease_id": lease_b}, token=ta)
    assert code is C.PERMISSION_DENIED and detail["reason"] == "not_owner"
    after = raw.ok("GetNode", {"node_id": nb}, token=tb)
    assert {**after, "held": {}} == {**before, "held": {}}
    assert after["held"] == {"db": 1} and after["children"] == []


def test_forged_expired_and_missing_credentials(daemon: Daemon, raw: Raw) -> None:
    _, code, detail = raw("Heartbeat", {}, token="forged-token-0123456789")
    assert code is C.UNAUTHENTICATED and detail["reason"] == "bad_token"
    _, code, detail = raw("OpenSession", {}, key="not-a-key")
    assert code is C.UNAUTHENTICATED and detail["reason"] == "bad_key"
    _, code, _ = raw("Consume", {"node_id": 1, "resource": "x"})
    assert code is C.UNAUTHENTICATED
    # a bare key may only EnsureNode and Consume
    _, code, detail = raw("Acquire", {"node_id": 2, "cls": "db"}, key=A)
    assert code is C.PERMISSION_DENIED and detail["reason"] == "needs_session"
    # a short session that is not heartbeated expires; its token is then refused
    tok = raw.session(A, ttl_ms=150)
    node = raw.ok("CreateNode", {"name": "short"}, token=tok)["node_id"]
    lease = raw.ok("Acquire", {"node_id": node, "cls": "db"}, token=tok)["lease_id"]
    assert wait_until(lambda: raw("GetNode", {}, token=tok)[1] is C.UNAUTHENTICATED, 5)
    _, code, detail = raw("Consume", {"node_id": node, "resource": "http"}, token=tok)
    assert code is C.UNAUTHENTICATED and detail["reason"] == "session_ended"
    # a late release learns how its lease ended
    _, code, detail = raw("Release", {"lease_id": lease}, token=tok)
    assert code is C.FAILED_PRECONDITION and detail["end"] == "session_expired"
    _, code, _ = raw("OpenSession", {"ttl_ms": 10}, key=A)
    assert code is C.INVALID_ARGUMENT


def test_malformed_messages_get_clear_errors(daemon: Daemon, raw: Raw) -> None:
    tok = raw.session(A)
    cases: list[tuple[bytes | dict[str, object], str]] = [
        (b"\xc1\xff garbage", "body"),
        (wire.pack([1, 2, 3]), "body"),
        (wire.pack({"node_id": 2, "resource": "http"}), "v"),
        (wire.pack({"v": 2, "node_id": 2, "resource": "http"}), "v"),
        ({"node_id": "2", "resource": "http"}, "node_id"),
        ({"node_id": 2, "resource": "http", "amount": True}, "amount"),
        ({"node_id": 2}, "resource"),
        ({"node_id": 2, "resource": "http", "surprise": 1}, "surprise"),
        ({"node_id": 2, "resource": "", "amount": 1}, "resource"),
        ({"node_id": 2, "resource": "http", "amount": -1}, "amount"),
    ]
    for body, field in cases:
        _, code, detail = raw("Consume", body, token=tok)
        assert code is C.INVALID_ARGUMENT, (body, code)
        assert detail.get("field") == field, (body, detail)
    _, code, detail = raw("CreateNode", {"name": "x", "quotas": {"http": "many"}}, token=tok)
    assert code is C.INVALID_ARGUMENT and "quotas" in detail["field"]
    _, code, detail = raw("SetDefaults", {"node_id": 2, "defaults": {"nope": 1}}, token=tok)
    assert code is C.INVALID_ARGUMENT and detail["field"] == "defaults.nope"
    info = raw.ok("GetNode", {}, token=tok)  # nothing changed: the tenant has no usage
    assert info["used"] == {} and info["children"] == []


def test_inflight_retry_waits_for_the_first_attempt(daemon: Daemon, raw: Raw) -> None:
    tok = raw.session(A)
    node = raw.ok("CreateNode", {"name": "j", "limits": {"db": 1}}, token=tok)["node_id"]
    first = raw.ok("Acquire", {"node_id": node, "cls": "db"}, token=tok)["lease_id"]
    body = {"node_id": node, "cls": "db", "request_id": "same"}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futs = [pool.submit(raw, "Acquire", body, token=tok) for _ in range(3)]
        wait_until(lambda: raw.ok("GetNode", {}, token=tok) is not None, 0.3)
        assert not any(f.done() for f in futs)
        raw.ok("Release", {"lease_id": first}, token=tok)
        results = [f.result(timeout=30) for f in futs]
    assert {r[1] for r in results} == {C.OK}
    assert len({r[0]["lease_id"] for r in results if r[0]}) == 1
    assert raw.ok("GetNode", {"node_id": node}, token=tok)["held"] == {"db": 1}
    # and a later retry (durable memory) gets the same lease
    assert raw.ok("Acquire", body, token=tok)["lease_id"] == results[0][0]["lease_id"]  # type: ignore[index]


def test_bare_key_request_ids_and_sessions_survive_restart(daemon: Daemon, raw: Raw) -> None:
    run = raw.ok("EnsureNode", {"name": "claude:4f2a", "quotas": {"tool_calls": 5}}, key=A)
    node = run["node_id"]
    assert run["created"] is True
    assert raw.ok("EnsureNode", {"name": "claude:4f2a"}, key=A) == {
        "node_id": node,
        "created": False,
    }
    body = {"node_id": node, "resource": "tool_calls", "request_id": "hook-1"}
    raw.ok("Consume", body, key=A)
    tok = raw.session(A, ttl_ms=20_000)
    lease = raw.ok("Acquire", {"node_id": node, "cls": "db"}, token=tok)["lease_id"]
    daemon.kill()
    daemon.start()
    raw.ok("Consume", body, key=A)  # the same request id: answered from the record
    info = raw.ok("GetNode", {"node_id": node}, token=tok)  # the session survived
    assert info["used"] == {"tool_calls": 1}
    assert raw.ok("Validate", {"lease_id": lease}, token=tok)["live"] is True
    assert raw.ok("EnsureNode", {"name": "claude:4f2a"}, key=A)["node_id"] == node
    assert raw.ok("Release", {"lease_id": lease}, token=tok)["released"] is True


def test_graceful_stop_exits_zero(sqlite_daemon: Daemon) -> None:
    raw = Raw(sqlite_daemon.addr)
    try:
        raw.session(A)
    finally:
        raw.close()
    assert sqlite_daemon.stop() == 0
    assert "stopped" in sqlite_daemon.stderr()


def test_cancelled_acquire_leaves_no_lease(daemon: Daemon, raw: Raw) -> None:
    tok = raw.session(A)
    node = raw.ok("CreateNode", {"name": "c", "limits": {"db": 1}}, token=tok)["node_id"]
    held = raw.ok("Acquire", {"node_id": node, "cls": "db"}, token=tok)["lease_id"]
    stub = raw.channel.unary_unary(wire.path("Acquire"))
    waits = [
        stub.future(
            wire.pack({"v": 1, "node_id": node, "cls": "db"}), metadata=[(wire.TOKEN_MD, tok)]
        )
        for _ in range(3)
    ]
    wait_until(lambda: False, 0.3)  # let them queue
    for w in waits:
        assert w.cancel()
    wait_until(lambda: False, 0.2)  # let the server see the cancellations
    raw.ok("Release", {"lease_id": held}, token=tok)
    assert wait_until(lambda: raw.ok("GetNode", {"node_id": node}, token=tok)["held"] == {}, 2)
    again = raw.ok("Acquire", {"node_id": node, "cls": "db", "timeout_ms": 2000}, token=tok)
    assert again["lease_id"] > held  # the slot was free: no cancelled waiter took it

"""A session token is a credential no one computes: against a real governord.

The attack: a bare API key's session once had the token ``governord-key-session:`` +
sha256(key), and that digest is in governord.yaml (``api_key_sha256``). Whoever read the file
could read the tenant's tree, take its leases, set its limits to 0, cancel its job and close
the key's session (the tenant's own key then failed until a restart), and it survived restarts.
Now the key's session has a random token no one is given, the derived form is refused before
any lookup, and the tenant's key works throughout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from governor.authority import Authority
from governor.engine import ROOT_ID, Engine
from governor.store import EventLog
from tests.governor._daemon import KEYS, Daemon, Raw
from tests.governor._stores import make_target

KEY = KEYS["KEY_A"]
DIGEST = hashlib.sha256(KEY.encode()).hexdigest()  # what api_key_sha256 puts in the file
DERIVED = "governord-key-session:" + DIGEST
JOB_CALLS = 20  # consumes the tenant's bare key makes per phase


@pytest.fixture
def gov(tmp_path: Path) -> Iterator[Daemon]:
    for store in make_target("sqlite", tmp_path):
        tenants = {
            "a": {"api_key_sha256": DIGEST, "quotas": {"http": 100_000}, "limits": {"db": 4}},
            "b": {"api_key_env": "KEY_B"},
        }
        d = Daemon(tmp_path, store, tenants=tenants)
        d.start()
        try:
            yield d
        finally:
            d.close()


def _tenant_works(raw: Raw, job: int) -> int:
    """What the victim does: its bare key charges its job; returns the calls that succeeded."""
    ok = 0
    for _ in range(JOB_CALLS):
        _, code, _ = raw("Consume", {"node_id": job, "resource": "http", "amount": 1}, key=KEY)
        ok += code is grpc.StatusCode.OK
    return ok


def _attack(raw: Raw, job: int) -> dict[str, tuple[grpc.StatusCode, str]]:
    """Every call the issue made with the derived token; the code and reason of each."""
    calls: dict[str, dict[str, Any]] = {
        "GetNode": {"node_id": job},
        "Acquire": {"node_id": job, "cls": "db", "timeout_ms": 1000},
        "SetLimit": {"node_id": job, "cls": "db", "limit": 0},
        "CancelNode": {"node_id": job},
        "CloseSession": {},
    }
    out = {}
    for method, body in calls.items():
        _, code, detail = raw(method, body, token=DERIVED)
        out[method] = (code, str(detail.get("reason")))
    return out


def _refused(out: dict[str, tuple[grpc.StatusCode, str]]) -> bool:
    return all(v == (grpc.StatusCode.UNAUTHENTICATED, "derived_token") for v in out.values())


@pytest.mark.slow
def test_a_token_derived_from_the_config_is_refused_and_the_tenant_is_unaffected(
    gov: Daemon,
) -> None:
    raw = Raw(gov.addr)
    try:
        job = int(raw.ok("EnsureNode", {"name": "job", "limits": {"db": 4}}, key=KEY)["node_id"])
        baseline = _tenant_works(raw, job)
        assert baseline == JOB_CALLS

        out = _attack(raw, job)
        assert _refused(out), out

        # the victim: its key works as before, its job is untouched
        assert _tenant_works(raw, job) == baseline
        token = raw.session(KEY)
        node = raw.ok("GetNode", {"node_id": job}, token=token)
        assert node["state"] == "active" and node["limits"] == {"db": 4}
        assert node["held"] == {} and node["used"] == {"http": 2 * JOB_CALLS}

        # after a restart: still refused, and the key still finds its one session
        gov.stop()
        gov.start()
        raw.close()
        raw = Raw(gov.addr)
        assert _refused(_attack(raw, job))
        assert _tenant_works(raw, job) == baseline
        token = raw.session(KEY)
        node = raw.ok("GetNode", {"node_id": job}, token=token)
        assert node["state"] == "active" and node["used"] == {"http": 3 * JOB_CALLS}
    finally:
        raw.close()


@pytest.mark.slow
def test_a_key_session_left_by_an_older_release_is_closed_and_unreachable(
    gov: Daemon,
) -> None:
    """A record written before random key sessions holds the key's session under the derived
    token's hash: that token is refused, and the key's first call closes the old session."""
    raw = Raw(gov.addr)
    job = int(raw.ok("EnsureNode", {"name": "job"}, key=KEY)["node_id"])
    raw.close()
    gov.stop()
    store = gov.store
    authority = Authority(EventLog(store.backend()))
    try:
        legacy = hashlib.sha256(DERIVED.encode()).hexdigest()

        def plant(e: Engine) -> int:
            nodes = e.state.nodes.values()
            (scope,) = [n.id for n in nodes if n.parent == ROOT_ID and n.name == "a"]
            return e.open_session(scope, 10 * 365 * 86_400_000, legacy)[0]

        old_sid = authority.call(plant)
    finally:
        authority.close()

    gov.start()
    raw = Raw(gov.addr)
    try:
        out = _attack(raw, job)
        assert _refused(out), out
        assert _tenant_works(raw, job) == JOB_CALLS  # the key's first calls
        token = raw.session(KEY)
        assert raw.ok("GetNode", {"node_id": job}, token=token)["used"] == {"http": JOB_CALLS}
    finally:
        raw.close()
    gov.stop()
    authority = Authority(EventLog(store.backend()))
    try:
        state = authority.read(lambda e: e.state.sessions[old_sid].state.value)
        assert state == "closed"
    finally:
        authority.close()


@pytest.mark.slow
def test_no_caller_can_lock_the_key_out(gov: Daemon) -> None:
    """The key's session has no token anyone holds: a CloseSession with the derived token,
    another tenant's session closing itself, or the tenant closing its own token session all
    leave the key working, before and after a restart."""
    raw = Raw(gov.addr)
    try:
        job = int(raw.ok("EnsureNode", {"name": "job"}, key=KEY)["node_id"])
        baseline = _tenant_works(raw, job)
        raw("CloseSession", {}, token=DERIVED)  # the attack; its answer is the test above's
        raw.ok("CloseSession", {}, token=raw.session(KEYS["KEY_B"]))
        raw.ok("CloseSession", {}, token=raw.session(KEY))
        assert _tenant_works(raw, job) == baseline == JOB_CALLS
    finally:
        raw.close()
    gov.stop()
    gov.start()
    raw = Raw(gov.addr)
    try:
        assert _tenant_works(raw, job) == JOB_CALLS
    finally:
        raw.close()

"""Credit blocks over the wire, on a real governord (SQLite and PostgreSQL): grants, returns
once, denials with their codes, scope, and bad input refused naming the field."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import grpc
import pytest

from tests.governor._daemon import KEYS, Daemon, Raw, free_port
from tests.governor._stores import make_target

A, B = KEYS["KEY_A"], KEYS["KEY_B"]

pytestmark = pytest.mark.slow  # every test starts governord


def test_reserve_spend_return_once_and_the_bucket_on_get_node(raw: Raw) -> None:
    token = raw.session(A, ttl_ms=5_000)
    node = raw.ok("CreateNode", {"name": "strict", "rates": {"http": [10, 30]}}, token=token)[
        "node_id"
    ]
    block = raw.ok(
        "ReserveCredit",
        {"node_id": node, "resource": "http", "units": 50, "request_id": "r1"},
        token=token,
    )
    assert block["units"] == 30 and block["ttl_ms"] == 5_000  # the burst; the session's TTL
    again = raw.ok(
        "ReserveCredit",
        {"node_id": node, "resource": "http", "units": 50, "request_id": "r1"},
        token=token,
    )
    assert again == block  # a resend gets the same block
    info = raw.ok("GetNode", {"node_id": node}, token=token)
    assert info["rates"] == {"http": [10, 30]}
    assert info["credit"]["http"]["outstanding"] == 30
    assert info["credit"]["http"]["level"] + 30 <= 30
    tenant = raw.ok("GetNode", {}, token=token)
    assert tenant["used"]["http"] == 30  # charged to the tenant's cap of 1000 too
    first = raw.ok("ReturnCredit", {"block_id": block["block_id"], "unused": 20}, token=token)
    assert first == {"block_id": block["block_id"], "returned": True, "end": "returned"}
    second = raw.ok("ReturnCredit", {"block_id": block["block_id"], "unused": 20}, token=token)
    assert second["returned"] is False
    assert raw.ok("GetNode", {}, token=token)["used"]["http"] == 10


def test_an_empty_bucket_is_resource_exhausted_with_the_denial(raw: Raw) -> None:
    token = raw.session(A)
    node = raw.ok("CreateNode", {"name": "s", "rates": {"http": [0, 2]}}, token=token)["node_id"]
    raw.ok("ReserveCredit", {"node_id": node, "resource": "http", "units": 2}, token=token)
    _, code, detail = raw(
        "ReserveCredit", {"node_id": node, "resource": "http", "units": 1}, token=token
    )
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert detail["denial"]["reason"] == "rate" and detail["denial"]["node_id"] == node


def test_credit_stays_inside_the_scope_and_blocks_with_their_session(raw: Raw) -> None:
    ta, tb = raw.session(A), raw.session(B)
    node = raw.ok("CreateNode", {"name": "s", "rates": {"http": [5, 5]}}, token=ta)["node_id"]
    _, code, detail = raw(
        "ReserveCredit", {"node_id": node, "resource": "http", "units": 1}, token=tb
    )
    assert code is grpc.StatusCode.PERMISSION_DENIED and detail["reason"] == "out_of_scope"
    block = raw.ok("ReserveCredit", {"node_id": node, "resource": "http", "units": 1}, token=ta)
    # another session's block answers as no block at all: a return is no existence oracle
    foreign = raw.ok("ReturnCredit", {"block_id": block["block_id"], "unused": 1}, token=tb)
    unknown = raw.ok("ReturnCredit", {"block_id": 999_999, "unused": 1}, token=tb)
    assert {**foreign, "block_id": 0} == {**unknown, "block_id": 0}
    assert foreign["returned"] is False and foreign["end"] == "expired"
    back = raw.ok("ReturnCredit", {"block_id": block["block_id"], "unused": 1}, token=ta)
    assert back["returned"] is True
    _, code, _ = raw("ReserveCredit", {"node_id": node, "resource": "http", "units": 1}, key=A)
    assert code is grpc.StatusCode.PERMISSION_DENIED  # a bare key holds no credit


@pytest.mark.parametrize(
    "method, body, field",
    [
        ("ReserveCredit", {"node_id": 2, "resource": "http", "units": 0}, "units"),
        ("ReserveCredit", {"node_id": 2, "resource": "http", "units": "1"}, "units"),
        ("ReserveCredit", {"node_id": 2, "resource": "http"}, "units"),
        ("ReturnCredit", {"block_id": 1, "unused": -1}, "unused"),
        ("ReturnCredit", {"block_id": "1", "unused": 0}, "block_id"),
        ("CreateNode", {"name": "x", "rates": {"http": [1]}}, "rates['http']"),
        ("CreateNode", {"name": "x", "rates": {"http": [1, 0]}}, "rates[http].burst"),
        ("SetRate", {"node_id": 2, "resource": "http", "per_s": 1}, "burst"),
    ],
)
def test_bad_input_names_the_field_and_changes_nothing(
    raw: Raw, method: str, body: dict[str, object], field: str
) -> None:
    token = raw.session(A)
    before = raw.ok("GetNode", {}, token=token)
    _, code, detail = raw(method, body, token=token)
    assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), detail
    assert detail.get("field") == field, detail
    assert raw.ok("GetNode", {}, token=token) == before


def test_a_rated_tenant_from_the_config_and_its_credit_metrics(tmp_path: Path) -> None:
    port = free_port()
    for store in make_target("sqlite", tmp_path):
        d = Daemon(tmp_path, store, metrics=f"127.0.0.1:{port}")
        d.config["tenants"]["a"]["rates"] = {"http": {"per_s": 0, "burst": 25}}
        d.start()
        r = Raw(d.addr)
        try:
            token = r.session(A)
            tenant = r.ok("GetNode", {}, token=token)
            assert tenant["rates"] == {"http": [0, 25]}
            r.ok(
                "ReserveCredit",
                {"node_id": tenant["node_id"], "resource": "http", "units": 10},
                token=token,
            )
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
                text = page.read().decode()
        finally:
            r.close()
            d.close()
    for needle in (
        'governor_credit_level{resource="http",tenant="a"} 15.0',
        'governor_credit_outstanding{resource="http",tenant="a"} 10.0',
        'governor_events_total{kind="CreditGranted"} 1.0',
    ):
        assert needle in text, needle

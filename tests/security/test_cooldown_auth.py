"""Who may cool a limit, against a real `mesh node`: POST /v1/cooldown stops a tenant's limit
fleet-wide, so it needs the operator's token or the tenant's own, is at most
`sidecar.cooldown_max_s`, is only for limits with a policy (made-up tenants take no room),
and DELETE ends it. The tenant whose limit an attacker tries to cool keeps its rate."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.security.test_http_liveness import ADMIT_S, RATE, Node, _admitted

pytestmark = pytest.mark.slow

OPERATOR = "operator-token-0123456789abcdef01"
ACME = "acme-token-0123456789abcdef012345"
BETA = "beta-token-0123456789abcdef012345"
MAX_S = 60
MADE_UP = 600  # made-up tenants a caller tries to cool


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(
        tmp_path,
        env={"OP_TOKEN": OPERATOR, "ACME_TOKEN": ACME, "BETA_TOKEN": BETA},
        sidecar={
            "http_listen": "127.0.0.1:0",
            "operator_token_env": "OP_TOKEN",
            "tenant_tokens": {
                "acme": {"token_env": "ACME_TOKEN"},
                "beta": {"token_env": "BETA_TOKEN"},
            },
            "cooldown_max_s": MAX_S,
        },
        policies={"inline": [RATE, dict(RATE, tenant_id="beta")]},
    )
    try:
        yield n
    finally:
        n.close()


def cool(
    addr: str, body: dict[str, Any], token: str | None, method: str = "POST"
) -> httpx.Response:
    headers = {} if token is None else {"x-ratemesh-token": token}
    return httpx.request(
        method, f"http://{addr}/v1/cooldown", json=body, headers=headers, timeout=10
    )


def cooling(addr: str) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(f"http://{addr}/health", timeout=10).json()["cooldown"]
    return out


def test_an_attacker_cannot_cool_a_tenant_and_the_tenant_keeps_its_rate(node: Node) -> None:
    """Without a token, with a wrong one, or with another tenant's, a cooldown of acme is
    refused as fast as an attacker can ask; acme's admitter, measured without and then beside
    the attack, keeps its admitted count within 5 %."""
    addr = node.ready["sidecar"]["http"]
    acme = {"tenant": "acme", "metric": "read_iops", "cooldown_s": MAX_S}
    without, errors_without = _admitted(addr, ADMIT_S)
    done = threading.Event()
    codes: dict[int, int] = {}

    def attacker() -> None:
        with httpx.Client(timeout=10) as client:
            for i in range(10**9):
                if done.is_set():
                    return
                token = (None, "wrong", BETA)[i % 3]
                headers = {} if token is None else {"x-ratemesh-token": token}
                r = client.post(f"http://{addr}/v1/cooldown", json=acme, headers=headers)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    try:
        with_attack, errors_with = _admitted(addr, ADMIT_S)
    finally:
        done.set()
        thread.join(30)
    print(f"without={without} with={with_attack} attack={codes}")
    assert set(codes) <= {401, 403} and sum(codes.values()) > 30, codes
    assert cooling(node.ready["telemetry"])["cooling"] == 0
    assert errors_without == errors_with == 0
    assert abs(with_attack - without) <= 0.05 * without, (without, with_attack)


def test_made_up_tenants_take_no_room_and_real_429s_still_cool(node: Node) -> None:
    addr, tel = node.ready["sidecar"]["http"], node.ready["telemetry"]
    rng = random.Random(11)
    print("seed=11")
    with httpx.Client(timeout=10) as client:
        for i in range(MADE_UP):
            body = {"tenant": f"ghost-{rng.getrandbits(40):x}-{i}", "metric": "read_iops"}
            token = (None, OPERATOR)[i % 2]
            headers = {} if token is None else {"x-ratemesh-token": token}
            r = client.post(f"http://{addr}/v1/cooldown", json=body, headers=headers)
            assert r.status_code == (401 if token is None else 400), (i, r.text)
            if token is not None:
                assert "no policy" in r.json()["error"]
    assert cooling(tel)["cooling"] == 0
    # the real tenant's own 429, reported with its own token, still cools its limit
    r = cool(addr, {"tenant": "acme", "metric": "read_iops", "cooldown_s": 30}, ACME)
    assert (r.status_code, r.json()) == (200, {"ok": True})
    v = httpx.post(f"http://{addr}/v1/admit", json={"tenant": "acme", "metric": "read_iops"})
    assert v.json()["allowed"] is False and v.json()["suspended"] == "cooldown"
    assert cooling(tel)["cooling"] == 1


def test_a_cooldown_is_bounded_and_clearable_by_its_tenant_or_the_operator(node: Node) -> None:
    addr = node.ready["sidecar"]["http"]
    acme = {"tenant": "acme", "metric": "read_iops"}

    def admits() -> bool:
        r = httpx.post(f"http://{addr}/v1/admit", json=acme, timeout=10)
        return bool(r.json()["allowed"])

    too_long = cool(addr, {**acme, "cooldown_s": MAX_S + 1}, OPERATOR)
    assert too_long.status_code == 400 and "cooldown_max_s" in too_long.json()["error"]
    assert admits()
    assert cool(addr, {**acme, "cooldown_s": MAX_S}, ACME).status_code == 200
    assert not admits()
    # beta's token cannot end acme's cooldown, nor can no token
    assert cool(addr, acme, BETA, "DELETE").status_code == 403
    assert cool(addr, acme, None, "DELETE").status_code == 401
    assert not admits()
    assert cool(addr, acme, ACME, "DELETE").json() == {"ok": True}
    assert admits()
    # the operator may cool and clear any tenant with a policy
    beta = {"tenant": "beta", "metric": "read_iops"}
    assert cool(addr, {**beta, "cooldown_s": 5}, OPERATOR).status_code == 200
    assert cool(addr, beta, OPERATOR, "DELETE").status_code == 200
    again = cool(addr, beta, OPERATOR, "DELETE")
    assert again.status_code == 400 and "not cooling" in again.json()["error"]


def test_a_tenant_token_that_is_the_operators_is_refused_at_start(tmp_path: Path) -> None:
    """One line naming the field, exit 2: a tenant holding the operator's token could cool
    every tenant."""
    import os

    import yaml

    from tests.mesh._util import run_mesh, static_nodes

    cfg = static_nodes(["a"], [RATE])[0]
    cfg["sidecar"] = {
        "http_listen": "127.0.0.1:0",
        "operator_token_env": "OP_TOKEN",
        "tenant_tokens": {"acme": {"token_env": "OP_TOKEN"}},
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = run_mesh("validate", "--config", str(path), env={**os.environ, "OP_TOKEN": OPERATOR})
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "sidecar.tenant_tokens.acme" in lines[0], out.stderr

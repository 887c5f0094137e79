"""Who may read every tenant's detail, against real processes: governord's /ui, /ui/status
and /metrics, and a node's /health, /metrics and /ui, served on all addresses as Kubernetes
serves them. A caller off loopback without the token sees no tenant: 401, or the page's
public form (health status, metrics without tenant series). Liveness carries no tenant
data. The operator (the token, or loopback) still reads everything."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._addresses import port_of
from tests.governor._daemon import Daemon, free_port
from tests.governor._stores import StoreTarget
from tests.security.test_http_liveness import Node

pytestmark = pytest.mark.slow

TOKEN = "pages-token-0123456789abcdef0123"


def outside_address() -> str:
    """This host's address on its first non-loopback interface: a caller from it is off
    loopback, as a pod's neighbour is."""
    found = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # no packet is sent: this picks the route's source
            found.add(str(s.getsockname()[0]))
        except OSError:
            pass
    try:
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    outside = sorted(a for a in found if not a.startswith(("127.", "0.")))
    if not outside:
        pytest.skip("this host has no non-loopback address to call from")
    return outside[0]


def get(host: str, port: int, path: str, token: str | None = None) -> httpx.Response:
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    return httpx.get(f"http://{host}:{port}{path}", headers=headers, timeout=10)


@pytest.fixture
def governord(tmp_path: Path) -> Iterator[tuple[Daemon, int]]:
    port = free_port()
    daemon = Daemon(tmp_path, StoreTarget("sqlite", str(tmp_path / "governor.db"), ""))
    daemon.config["metrics"] = f"0.0.0.0:{port}"
    daemon.config["pages"] = {"token_env": "PAGES_TOKEN"}
    daemon.extra_env["PAGES_TOKEN"] = TOKEN
    try:
        daemon.start()
        yield daemon, port
    finally:
        daemon.close()


def test_governord_shows_tenants_only_to_loopback_and_the_token(
    governord: tuple[Daemon, int],
) -> None:
    _, port = governord
    outside = outside_address()
    # the operator: loopback, or the token from outside, reads every tenant
    for host, token in (("127.0.0.1", None), (outside, TOKEN)):
        status = get(host, port, "/ui/status", token)
        assert status.status_code == 200
        assert {"a", "b"} <= {n["name"] for n in status.json()["tree"]}
        assert get(host, port, "/ui", token).status_code == 200
        assert "governor_tenant_" in get(host, port, "/metrics", token).text
    # anyone else off loopback: no tenant anywhere
    for path in ("/ui/status", "/ui"):
        r = get(outside, port, path)
        assert r.status_code == 401, (path, r.status_code)
        assert "tenant" in r.json()["error"] and r.headers["www-authenticate"] == "Bearer"
    assert get(outside, port, "/ui/status", "wrong-token").status_code == 401
    public = get(outside, port, "/metrics")
    assert public.status_code == 200 and "governor_nodes" in public.text
    assert "tenant=" not in public.text and "governor_tenant_" not in public.text
    for path in ("/health/live", "/health/ready", "/health"):
        r = get(outside, port, path)
        assert r.status_code == 200, (path, r.text)
        assert '"a"' not in r.text and '"b"' not in r.text, (path, r.text)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(
        tmp_path,
        env={"OPERATOR_TOKEN": TOKEN},
        telemetry_listen="0.0.0.0:0",
        sidecar={"http_listen": "127.0.0.1:0", "operator_token_env": "OPERATOR_TOKEN"},
    )
    try:
        yield n
    finally:
        n.close()


def test_a_node_shows_tenants_only_to_loopback_and_the_operator_token(node: Node) -> None:
    port = port_of(node.ready["telemetry"])
    sidecar = node.ready["sidecar"]["http"]
    one = {"tenant": "acme", "metric": "read_iops"}
    assert httpx.post(f"http://{sidecar}/v1/admit", json=one, timeout=10).status_code == 200
    outside = outside_address()
    for host, token in (("127.0.0.1", None), (outside, TOKEN)):
        health: dict[str, Any] = get(host, port, "/health", token).json()
        assert {(x["tenant"], x["metric"]) for x in health["limits"]} == {("acme", "read_iops")}
        assert 'tenant="acme"' in get(host, port, "/metrics", token).text
        assert get(host, port, "/ui", token).status_code == 200
    r = get(outside, port, "/health")
    assert r.status_code == 200 and r.json()["status"] == "serving"
    assert "acme" not in r.text and "limits" not in r.json() and "membership" not in r.json()
    metrics = get(outside, port, "/metrics")
    assert metrics.status_code == 200 and "tenant=" not in metrics.text
    assert "ratemesh_" in metrics.text  # the node's own series are still there
    ui = get(outside, port, "/ui")
    assert ui.status_code == 401 and ui.headers["www-authenticate"] == "Bearer"
    assert get(outside, port, "/health", "wrong-token").json().get("limits") is None

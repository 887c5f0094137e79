"""Hostile bodies to a node's sidecar HTTP API, against a real `mesh node`: JSON nested far
deeper than any item is a 400 with a clear error (never a 500 and a traceback in the log),
costs no more than its bytes, and an admitter asking beside it keeps its rate."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests._addresses import host_port
from tests.security.test_http_liveness import ADMIT_S, Node, _admitted

pytestmark = pytest.mark.slow

BOMBS = [
    b"[" * 200_000,
    b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"tenant": "acme", "metric": "read_iops", "descriptors": ' + b'{"a":' * 50_000 + b"}",
]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.close()


def test_deeply_nested_json_is_a_400_without_a_traceback(node: Node) -> None:
    addr = node.ready["sidecar"]["http"]
    with httpx.Client(timeout=10) as client:
        for bomb in BOMBS:
            r = client.post(f"http://{addr}/v1/admit", content=bomb)
            assert r.status_code == 400, (r.status_code, r.text[:200])
            assert r.json()["error"].startswith("body: "), r.json()
        ok = client.post(f"http://{addr}/v1/admit", json={"tenant": "acme", "metric": "read_iops"})
        assert ok.status_code == 200 and ok.json()["allowed"] is True
    time.sleep(0.5)  # anything the node logged for those calls is in
    log = "".join(node.stderr)
    assert "Traceback" not in log and "RecursionError" not in log, log[-2000:]


def test_an_admitter_keeps_its_rate_beside_nested_json(node: Node) -> None:
    """ADMIT_S of admissions without, then with a thread sending nested bodies as fast as
    it can: the admitted count is within 5 %, no call of the admitter fails, and every
    bomb was a 400."""
    addr = node.ready["sidecar"]["http"]
    without, errors_without = _admitted(addr, ADMIT_S)
    done = threading.Event()
    codes: dict[int, int] = {}

    def bomber() -> None:
        with httpx.Client(timeout=10) as client:
            i = 0
            while not done.is_set():
                r = client.post(f"http://{addr}/v1/admit", content=BOMBS[i % len(BOMBS)])
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                i += 1

    thread = threading.Thread(target=bomber, daemon=True)
    thread.start()
    try:
        with_bombs, errors_with = _admitted(addr, ADMIT_S)
    finally:
        done.set()
        thread.join(30)
    print(f"without={without} with={with_bombs} bombs={codes}")
    assert set(codes) == {400} and codes[400] > 10, codes
    assert errors_without == errors_with == 0
    assert abs(with_bombs - without) <= 0.05 * without, (without, with_bombs)


def test_a_body_that_never_arrives_is_dropped(node: Node) -> None:
    """A head that promises a body and sends none: answered 408 after the body timeout,
    never held open for ever."""
    with socket.create_connection(host_port(node.ready["sidecar"]["http"]), timeout=30) as s:
        s.sendall(b"POST /v1/admit HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]

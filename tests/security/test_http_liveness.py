"""Liveness under connection floods, against real processes: governord's HTTP port and a
mesh node's telemetry and sidecar HTTP ports. Sockets that say nothing, heads sent a byte at a
time, and many connections from one address: the health probe (from another address, as a
kubelet's is) answers 200 on every try, and an admitter on the sidecar keeps its rate."""

from __future__ import annotations

import errno
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench._procs import read_ready, spawn, stop
from tests._addresses import host_port
from tests.governor._daemon import Daemon, free_port
from tests.governor._stores import StoreTarget
from tests.mesh._util import static_nodes

pytestmark = pytest.mark.slow

PROBES = 12
PROBE_GAP_S = 0.25
# governord: 64 connections, 16 a peer; the node: 256 connections, 128 a peer (the defaults)
GOVERNORD_FLOOD = {"idle": (8, 24), "slowloris": (8, 24), "one_peer": (1, 300)}
NODE_FLOOD = {"idle": (8, 80), "slowloris": (8, 80), "one_peer": (1, 400)}
# The admitter's limit: it asks well above it (hundreds a second), so what it is admitted is
# what the policy grants it, and any call the flood costs it shows as a shortfall.
RATE = {
    "tenant_id": "acme",
    "metric": "read_iops",
    "generation": 1,
    "mode": "local",
    "target_rate": 50,
    "global_burst": 100,  # two seconds of burst: a pause of the asker on a loaded host loses
    "local_burst_cap": 100,  # nothing
}
ADMIT_S = 6.0
REFILL_S = 2.5  # a full bucket before each measurement
ADMITTER_THREADS = 4


class Flood(threading.Thread):
    """Keeps `per_source` sockets open to `addr` from each of `sources` (loopback
    addresses other than the probe's), opening again every one the server closes. `slow`:
    each sends a request head one byte every half second and never finishes it."""

    def __init__(self, addr: str, sources: list[str], per_source: int, *, slow: bool, seed: int):
        super().__init__(daemon=True)
        self.target = host_port(addr)
        self.sources = sources
        self.per_source = per_source
        self.slow = slow
        self.rng = random.Random(seed)
        self.socks: dict[socket.socket, int] = {}  # socket -> bytes of the head sent
        self.opened = 0
        self.closed_by_server = 0
        self.most_open = 0
        self.done = threading.Event()

    def _open(self, source: str) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((source, 0))
            s.settimeout(2)
            s.connect(self.target)
            s.setblocking(False)
        except OSError:
            s.close()
            return
        self.socks[s] = 0
        self.opened += 1

    def run(self) -> None:
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000
        next_byte = time.monotonic()
        while not self.done.is_set():
            by_source: dict[str, int] = {}
            for s in list(self.socks):
                try:
                    gone = s.recv(1, socket.MSG_PEEK) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    self.closed_by_server += 1
                    del self.socks[s]
                    s.close()
                    continue
                src = s.getsockname()[0]
                by_source[src] = by_source.get(src, 0) + 1
            for src in self.sources:
                for _ in range(self.per_source - by_source.get(src, 0)):
                    if self.done.is_set():
                        break
                    self._open(src)
            self.most_open = max(self.most_open, len(self.socks))
            if self.slow and time.monotonic() >= next_byte:
                next_byte = time.monotonic() + 0.5
                for s, sent in list(self.socks.items()):
                    try:
                        s.send(head[sent % len(head) : sent % len(head) + 1])
                        self.socks[s] = sent + 1
                    except OSError as exc:
                        if exc.errno != errno.EAGAIN:
                            del self.socks[s]
                            s.close()
            self.done.wait(0.05 + self.rng.random() * 0.05)
        for s in self.socks:
            s.close()

    def stop(self) -> None:
        self.done.set()
        self.join(30)


def probes(url: str) -> list[int]:
    """PROBES health probes from 127.0.0.1, each on a new connection, as a kubelet sends."""
    codes = []
    for _ in range(PROBES):
        try:
            codes.append(httpx.get(url, timeout=5).status_code)
        except httpx.HTTPError as exc:
            codes.append(-1)
            print("probe failed:", type(exc).__name__, exc)
        time.sleep(PROBE_GAP_S)
    return codes


class FloodProcess:
    """A `Flood` in a process of its own, as an attacker is: started, it returns once its
    sockets are open (or 30 s went by); `stop` ends it and returns its counts."""

    def __init__(self, addr: str, sources: int, per_source: int, *, slow: bool, seed: int):
        args = [addr, str(sources), str(per_source), "slow" if slow else "idle", str(seed)]
        self.proc = spawn(["-m", "tests.security.test_http_liveness", *args])
        try:
            self.started = read_ready(self.proc, timeout_s=60)
        except BaseException:
            stop(self.proc, kill=True)
            raise

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # its signal to end
        try:
            return read_ready(self.proc, timeout_s=60)
        finally:
            stop(self.proc)


def _flood_main(argv: list[str]) -> None:
    """The flood process: ADDR SOURCES PER_SOURCE idle|slow SEED. One JSON line once its
    sockets are open, one with its counts when stdin closes."""
    import json
    import sys

    addr, sources, per_source, kind, seed = argv
    flood = Flood(
        addr,
        [f"127.0.0.{2 + i}" for i in range(int(sources))],
        int(per_source),
        slow=kind == "slow",
        seed=int(seed),
    )
    flood.start()
    deadline = time.monotonic() + 30
    while flood.opened < int(sources) * int(per_source) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the flood holds its sockets (and slow heads have begun)
    print(json.dumps({"opened": flood.opened}), flush=True)
    sys.stdin.read()
    flood.stop()
    counts = {"opened": flood.opened, "most_open": flood.most_open}
    print(json.dumps({**counts, "closed_by_server": flood.closed_by_server}), flush=True)


def flooded(url: str, addr: str, kind: str, shape: tuple[int, int], seed: int) -> None:
    """Probes answer 200 before the flood and on every try during it."""
    assert probes(url) == [200] * PROBES, "the probe fails without any flood"
    sources, per_source = shape
    flood = FloodProcess(addr, sources, per_source, slow=kind == "slowloris", seed=seed)
    try:
        during = probes(url)
    finally:
        counts = flood.stop()
    print(f"seed={seed} {kind}: {counts} probes={during}")
    assert flood.started["opened"] >= sources * per_source, "the flood never got its sockets open"
    assert during == [200] * PROBES, f"seed={seed} {kind}: probes {during}"


@pytest.fixture
def governord(tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    port = free_port()
    daemon = Daemon(tmp_path, StoreTarget("sqlite", str(tmp_path / "governor.db"), ""))
    daemon.config["metrics"] = f"127.0.0.1:{port}"
    try:
        daemon.start()
        yield daemon, f"127.0.0.1:{port}"
    finally:
        daemon.close()


class Node:
    """A `mesh node` process on loopback (one member, RATE's policy), its stderr drained
    into `stderr` as it comes (a node that logs much never blocks on a full pipe)."""

    def __init__(self, tmp: Path, env: dict[str, str] | None = None, **extra: Any) -> None:
        cfg = static_nodes(["a"], [RATE])[0]
        cfg.update(telemetry_listen="127.0.0.1:0", sidecar={"http_listen": "127.0.0.1:0"})
        cfg.update(extra)
        path = tmp / "node.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.stderr: list[str] = []
        self.proc = spawn(["-m", "mesh.cli", "node", "--config", str(path)], env=env)
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()
        try:
            self.ready = read_ready(self.proc, timeout_s=60)
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self._drain.join(10)
        stop(self.proc)


def _node(tmp: Path, **extra: Any) -> Iterator[dict[str, Any]]:
    n = Node(tmp, **extra)
    try:
        yield n.ready
    finally:
        n.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    yield from _node(tmp_path)


@pytest.mark.parametrize("kind", sorted(GOVERNORD_FLOOD))
def test_governord_liveness_answers_through_a_flood(
    governord: tuple[Daemon, str], kind: str
) -> None:
    _, addr = governord
    flooded(f"http://{addr}/health/live", addr, kind, GOVERNORD_FLOOD[kind], seed=3)


@pytest.mark.parametrize("kind", sorted(NODE_FLOOD))
def test_node_health_answers_through_a_flood(node: dict[str, Any], kind: str) -> None:
    addr = node["telemetry"]
    flooded(f"http://{addr}/health", addr, kind, NODE_FLOOD[kind], seed=5)


def _admitted(addr: str, seconds: float) -> tuple[int, int]:
    """(admitted, errors) for an admitter of ADMITTER_THREADS keep-alive connections asking
    the sidecar as fast as they can for `seconds`, after REFILL_S for a full bucket."""
    time.sleep(REFILL_S)
    counts = {"admitted": 0, "errors": 0, "asked": 0}
    seen: list[str] = []  # the first few failed calls, said in the test's message
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def ask() -> None:
        with httpx.Client(timeout=10) as client:
            while time.monotonic() < end:
                try:
                    r = client.post(
                        f"http://{addr}/v1/admit", json={"tenant": "acme", "metric": "read_iops"}
                    )
                    ok = r.status_code == 200  # a 503 "too many connections" is a failed call
                    allowed = ok and r.json()["allowed"] is True
                    why = "" if ok else f"HTTP {r.status_code}: {r.text[:120]}"
                except httpx.HTTPError as exc:
                    ok = allowed = False
                    why = f"{type(exc).__name__}: {exc}"
                with lock:
                    counts["asked"] += 1
                    counts["errors"] += not ok
                    counts["admitted"] += allowed
                    if not ok and len(seen) < 3:
                        seen.append(why)

    threads = [threading.Thread(target=ask, daemon=True) for _ in range(ADMITTER_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    print(f"{counts} in {seconds} s; failed calls: {seen}")
    return counts["admitted"], counts["errors"]


def test_an_admitter_keeps_its_rate_through_a_flood_on_the_sidecar(
    node: dict[str, Any],
) -> None:
    """The same admitter, ADMIT_S without and ADMIT_S with an idle flood from many addresses
    on the sidecar's HTTP port: its admitted count is within 5 % and no call of it fails."""
    addr = node["sidecar"]["http"]
    without, errors_without = _admitted(addr, ADMIT_S)
    flood = FloodProcess(addr, 8, 80, slow=False, seed=7)
    try:
        with_flood, errors_with = _admitted(addr, ADMIT_S)
    finally:
        counts = flood.stop()
    print(f"seed=7 without={without} with={with_flood} flood={counts}")
    assert flood.started["opened"] >= 640
    assert errors_without == errors_with == 0
    assert abs(with_flood - without) <= 0.05 * without, (without, with_flood)


if __name__ == "__main__":
    import sys

    _flood_main(sys.argv[1:])

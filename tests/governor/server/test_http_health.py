"""governord's HTTP pages and log (part 4): /health, /health/live and /health/ready
answer liveness and readiness with 200/503, /metrics is Prometheus text on its own path, any
other path is 404, and stderr is one JSON event a line carrying the request id of a call."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from governor.authority import Authority
from governor.client import Client
from governor.config import GovernordConfig
from governor.engine import ROOT_ID
from governor.server._health import Health
from governor.server._http import HEAD_BYTES_MAX, HttpServer
from governor.server._metrics import Metrics
from governor.server._probe import probe_for
from governor.server._routes import Reply, Site, routes
from governor.store import EventLog, MemoryBackend
from tests._addresses import host_port, port_of
from tests.governor._daemon import KEYS, Daemon, free_port
from tests.governor._stores import make_target

A = KEYS["KEY_A"]


def _get(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of governord's stderr as a JSON event (fails on a line that is not one)."""
    events = []
    for line in text.splitlines():
        doc = json.loads(line)
        assert isinstance(doc, dict) and {"ts", "level", "logger", "msg"} <= doc.keys(), line
        events.append(doc)
    return events


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_health_metrics_and_404_on_their_own_paths(kind: str, tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    for store in make_target(kind, tmp_path):
        d = Daemon(tmp_path, store, metrics=f"127.0.0.1:{port}")
        d.start()
        try:
            status, ctype, body = _get(base + "/health")
            assert status == 200 and ctype == "application/json"
            report = json.loads(body)
            assert report["live"] is True and report["ready"] is True
            assert report["role"] == "leader" and report["status"] == "ready"
            assert report["checks"]["store"] == {**report["checks"]["store"], "ok": True}
            assert report["checks"]["store"]["kind"] == kind
            assert report["listen"] == [d.addr] and report["tenants"] == 2
            for path, question in (("/health/live", "live"), ("/health/ready", "ready")):
                status, _, body = _get(base + path)
                assert status == 200 and json.loads(body)[question] is True
            status, ctype, body = _get(base + "/metrics")
            assert status == 200 and ctype.startswith("text/plain")
            assert b"# TYPE governor_calls_total counter" in body and b"{" not in body[:1]
            for path in ("/", "/nope", "/metrics/x", "/healthz"):
                status, _, body = _get(base + path)
                assert status == 404, path
                assert "/health" in json.loads(body)["pages"]
            assert _get(base + "/health", method="POST")[0] == 405
            status, _, body = _get(base + "/health", method="HEAD")
            assert status == 200 and body == b""
        finally:
            d.close()


@pytest.mark.slow
def test_a_store_that_cannot_be_reached_is_live_but_not_ready(tmp_path: Path) -> None:
    """The SQLite file gone from under a running governord (its volume unmounted): the probe,
    on its own connection, cannot open it, so /health and /health/ready answer 503 naming the
    store, while /health/live stays 200 (the writer still commits to its open file)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    for store in make_target("sqlite", tmp_path):
        d = Daemon(tmp_path, store, metrics=f"127.0.0.1:{port}")
        d.start()
        try:
            assert _get(base + "/health/ready")[0] == 200
            moved = Path(store.target).rename(tmp_path / "elsewhere.db")
            deadline = asyncio.run(_wait_status(base + "/health/ready", 503))
            assert deadline, "readiness never went to 503"
            status, _, body = _get(base + "/health")
            report = json.loads(body)
            assert status == 503 and report["ready"] is False and report["live"] is True
            assert report["checks"]["store"]["ok"] is False
            assert "unable to open" in report["checks"]["store"]["error"]
            assert _get(base + "/health/live")[0] == 200
            moved.rename(store.target)
            assert asyncio.run(_wait_status(base + "/health/ready", 200))
        finally:
            d.close()


async def _wait_status(url: str, want: int, timeout_s: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        if (await asyncio.to_thread(_get, url))[0] == want:
            return True
        await asyncio.sleep(0.2)
    return False


@pytest.mark.slow
def test_the_log_is_one_json_event_a_line_with_the_request_id(tmp_path: Path) -> None:
    for store in make_target("sqlite", tmp_path):
        d = Daemon(tmp_path, store)
        d.args = ["--log-level", "DEBUG"]
        d.start()
        try:

            async def work(d: Daemon = d) -> None:
                async with Client(d.addr, A) as client:
                    async with client.task("logged", quotas={"http": 1}) as task:
                        await client.consume_at(task.node_id, "http")

            asyncio.run(work())
        finally:
            assert d.stop() == 0
        events = _json_lines(d.stderr())
        assert any(e["msg"].startswith("listening on") and e["listen"] == [d.addr] for e in events)
        assert events[-1]["msg"] == "stopped"
        # SIGTERM is said as it arrives, with the shared formatter's stable event name
        (term,) = [e for e in events if e["event"] == "shutdown_started"]
        assert term["signal"] == "SIGTERM" and term["logger"] == "governord", term
        calls = [e for e in events if e["logger"] == "governord.call"]
        consumes = [e for e in calls if e["method"] == "Consume"]
        assert consumes and all(e["code"] == "OK" and e["session_id"] > 0 for e in consumes)
        assert all(isinstance(e["request_id"], str) and e["request_id"] for e in consumes)
        assert all(e["took_ms"] >= 0 for e in calls)


def test_text_log_format_keeps_the_old_lines(tmp_path: Path) -> None:
    from governor.server._logs import configure

    out = tmp_path / "log.txt"
    with out.open("w") as stream:
        configure("text", "INFO", stream)
        import logging

        logging.getLogger("governord").info("stopped")
        logging.getLogger("governord.call").warning("call", extra={"fields": {"code": "X"}})
    configure()  # back to JSON on stderr for whatever runs next in this process
    assert out.read_text().splitlines() == ["governord: stopped", "governord: call (code=X)"]


# ---- in-process: the pages over a real HTTP server and a real (in-memory) record ----------


def _site(draining: list[bool]) -> tuple[Site, Authority]:
    authority = Authority(EventLog(MemoryBackend()))
    metrics = Metrics()
    metrics.attach(authority)
    health = Health(authority, probe_for("memory", "", "t"), draining=lambda: draining[0])
    return Site(authority, GovernordConfig(store="memory:"), metrics, health), authority


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_draining_is_live_but_not_ready_and_bad_requests_get_4xx() -> None:
    async def main() -> None:
        draining = [False]
        site, authority = _site(draining)
        http = HttpServer(routes(site))
        try:
            port = port_of(await http.start("127.0.0.1:0"))

            async def ask(data: bytes) -> bytes:
                return await asyncio.to_thread(_raw, port, data)

            ok = await ask(b"GET /health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert ok.startswith(b"HTTP/1.1 200 OK\r\n")
            draining[0] = True
            for path in (b"/health", b"/health/ready"):
                reply = await ask(b"GET " + path + b" HTTP/1.1\r\n\r\n")
                assert reply.startswith(b"HTTP/1.1 503 "), reply
                assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["checks"]["serving"] == {
                    "ok": False,
                    "draining": True,
                }
            live = await ask(b"GET /health/live HTTP/1.0\r\n\r\n")
            assert live.startswith(b"HTTP/1.1 200 ")
            assert (await ask(b"NONSENSE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
            big = b"GET /health HTTP/1.1\r\nX: " + b"a" * HEAD_BYTES_MAX + b"\r\n\r\n"
            assert (await ask(big)).startswith(b"HTTP/1.1 431 ")
            assert (await ask(b"DELETE /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
            query = await ask(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n")
            assert query.startswith(b"HTTP/1.1 200 ") and b"governor_nodes" in query
        finally:
            await http.close()
            authority.close()

    asyncio.run(main())


def test_a_page_that_fails_is_a_500_and_the_server_keeps_serving() -> None:
    async def broken() -> Reply:
        raise RuntimeError("bug")

    async def fine() -> Reply:
        return Reply(200, "text/plain", b"ok")

    async def main() -> None:
        http = HttpServer({"/broken": broken, "/fine": fine})
        try:
            port = port_of(await http.start("127.0.0.1:0"))
            bad = await asyncio.to_thread(_raw, port, b"GET /broken HTTP/1.1\r\n\r\n")
            assert bad.startswith(b"HTTP/1.1 500 ") and b"RuntimeError" in bad
            good = await asyncio.to_thread(_raw, port, b"GET /fine HTTP/1.1\r\n\r\n")
            assert good.endswith(b"\r\n\r\nok")
        finally:
            await http.close()

    asyncio.run(main())


def test_a_writer_that_cannot_commit_is_not_live_until_it_commits_again(tmp_path: Path) -> None:
    """Another connection holds the SQLite file's write lock: events wait for their commit,
    so past the stall bound governord is not live (a supervisor should restart it); once the
    lock goes the commit lands and it is live again."""
    import sqlite3

    from governor.store import SqliteBackend

    path = str(tmp_path / "g.db")
    failed: list[BaseException] = []
    log = EventLog(SqliteBackend(path, busy_timeout_ms=20_000), on_fatal=failed.append)
    authority = Authority(log)
    health = Health(
        authority, probe_for("sqlite", path, "t"), draining=lambda: False, stall_after_s=0.3
    )
    blocker = sqlite3.connect(path, isolation_level=None)

    async def main() -> None:
        assert (await health.report())["live"] is True
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            _, error, seq, _ = authority.step(lambda e: e.open_session(ROOT_ID, 60_000, "f" * 64))
            assert error is None and seq > log.committed_seq
            await asyncio.sleep(0.6)
            report = await health.report()
            assert report["live"] is False and report["ready"] is False, report
            assert report["status"] == "not_live"
            assert report["checks"]["writer"]["pending_events"] >= 1
        finally:
            blocker.execute("ROLLBACK")
        await asyncio.to_thread(log.wait, seq, 10)
        assert (await health.report())["live"] is True

    try:
        asyncio.run(main())
    finally:
        blocker.close()
        authority.close()
    assert failed == []


def test_an_ipv6_listener_reports_its_address_in_brackets() -> None:
    async def fine() -> Reply:
        return Reply(200, "text/plain", b"ok")

    async def main() -> None:
        http = HttpServer({"/fine": fine})
        try:
            address = await http.start("[::1]:0")
            host, port = host_port(address)
            assert address == f"[::1]:{port}" and host == "::1"

            def ask() -> bytes:
                with socket.create_connection((host, port), timeout=10) as s:
                    s.sendall(b"GET /fine HTTP/1.1\r\n\r\n")
                    return s.recv(65536)

            assert (await asyncio.to_thread(ask)).endswith(b"\r\n\r\nok")
        finally:
            await http.close()

    asyncio.run(main())

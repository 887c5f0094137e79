"""The fault tooling (governor.testing.faults, docs/faults.md) against real servers: PostgreSQL
at 127.0.0.1:5432 and a gRPC aio server through a `DelayProxy`, and (root, slow) processes in
a network namespace that reach PostgreSQL through `Netns.proxy_to` and lose it in a partition.
Only lower bounds on time are asserted (a delay is at least what was asked); "did not complete"
is checked with a bound the fault makes certain, and completion after healing with a generous
one."""

from __future__ import annotations

import asyncio
import os
import select
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import psycopg
import pytest
from grpc import aio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import governor.testing.faults as faults
from governor.testing.faults import (
    READ_CHUNK_BYTES,
    DelayProxy,
    Netns,
    NetnsUnavailable,
    ProxyError,
)
from tests.governor._stores import pg_dsn

PG = ("127.0.0.1", 5432)
HUNG_S = 1.0  # a query in a blackhole or partition must not have completed by then
HEAL_S = 30.0  # after healing it completes within this (TCP retransmission backs off)


def _via(proxy: DelayProxy, dsn: str, **extra: str | int) -> str:
    """`dsn` with its host and port replaced by the proxy's."""
    params = conninfo_to_dict(dsn)
    params.update(host=proxy.host, port=str(proxy.port), **extra)
    return make_conninfo("", **params)


@pytest.fixture
def dsn() -> str:
    return pg_dsn()


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except ConnectionError:
            pass  # the proxy resets its connections when it closes


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A plain TCP echo server on 127.0.0.1, port 0."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[:2]  # type: ignore[misc]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _in_thread(
    conn: psycopg.Connection[tuple[object, ...]], sql: str
) -> tuple[threading.Thread, list[object]]:
    """Run `sql` on `conn` in a daemon thread; the list gets its first row or its error."""
    out: list[object] = []

    def go() -> None:
        try:
            row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
            out.append(row[0] if row else None)
        except psycopg.Error as exc:
            out.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


# -- DelayProxy with PostgreSQL ----------------------------------------------------------------


@pytest.mark.postgres
def test_psycopg_queries_through_the_proxy(dsn: str) -> None:
    with DelayProxy(PG) as proxy, psycopg.connect(_via(proxy, dsn), autocommit=True) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        stats = proxy.stats()
        assert stats.connections_open == 1 and stats.bytes_forwarded > 0


@pytest.mark.postgres
def test_a_delay_makes_each_query_take_at_least_that_long(dsn: str) -> None:
    with DelayProxy(PG) as proxy, psycopg.connect(_via(proxy, dsn), autocommit=True) as conn:
        conn.execute("SELECT 1")
        proxy.set_delay_ms(200)
        for _ in range(3):
            t0 = time.monotonic()
            assert conn.execute("SELECT 2").fetchone() == (2,)
            assert time.monotonic() - t0 >= 0.2  # the query out and the reply back are held
        proxy.set_delay_ms(0)
        assert conn.execute("SELECT 3").fetchone() == (3,)


@pytest.mark.postgres
def test_a_blackhole_hangs_queries_and_new_connections_until_it_is_lifted(dsn: str) -> None:
    with DelayProxy(PG) as proxy, psycopg.connect(_via(proxy, dsn), autocommit=True) as conn:
        conn.execute("SELECT 1")
        proxy.blackhole(True)
        thread, out = _in_thread(conn, "SELECT 7")
        thread.join(HUNG_S)
        assert thread.is_alive() and out == [], "a query completed through a blackhole"
        # A new connection is accepted by the proxy but never reaches PostgreSQL: the client's
        # own timeout is what ends it (statement_timeout could not: the server never sees it).
        t0 = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(_via(proxy, dsn, connect_timeout=1)).close()
        assert time.monotonic() - t0 >= 0.9
        assert proxy.stats().connections_open >= 1  # nothing was closed
        proxy.blackhole(False)
        thread.join(HEAL_S)
        assert out == [7], f"the held query did not complete after the blackhole: {out}"
        with psycopg.connect(_via(proxy, dsn, connect_timeout=10)) as again:
            assert again.execute("SELECT 8").fetchone() == (8,)


@pytest.mark.postgres
def test_cut_resets_open_connections_and_accepts_new_ones(dsn: str) -> None:
    with DelayProxy(PG) as proxy:
        with psycopg.connect(_via(proxy, dsn), autocommit=True) as conn:
            conn.execute("SELECT 1")
            proxy.cut()
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 2")
        with psycopg.connect(_via(proxy, dsn, connect_timeout=10), autocommit=True) as conn:
            assert conn.execute("SELECT 3").fetchone() == (3,)


# -- DelayProxy's bounds and ordering, on a plain echo server -----------------------------------


def test_connections_beyond_the_bound_are_reset(echo: tuple[str, int]) -> None:
    with DelayProxy(echo, connections_max=2) as proxy:
        socks = [socket.create_connection((proxy.host, proxy.port), timeout=10) for _ in range(2)]
        try:
            for s in socks:  # both are through to the echo server before the third one
                s.sendall(b"x")
                assert s.recv(1) == b"x"
            try:  # the reset may come before connect() has returned
                with socket.create_connection((proxy.host, proxy.port), timeout=10) as third:
                    third.sendall(b"y")
                    got = third.recv(1)
            except ConnectionError:
                got = b""
            assert got == b"", "the connection beyond connections_max was served"
            assert proxy.stats().connections_refused == 1
        finally:
            for s in socks:
                s.close()


def test_a_blackhole_holds_at_most_the_bound_and_releases_it_in_order(
    echo: tuple[str, int],
) -> None:
    bound = 256 << 10
    payload = bytes(range(251)) * ((8 << 20) // 251)  # not a multiple of any chunk size
    with (
        DelayProxy(echo, buffered_bytes_max=bound) as proxy,
        socket.create_connection((proxy.host, proxy.port), timeout=60) as s,
    ):
        s.sendall(b"!")
        assert s.recv(1) == b"!"  # the connection is through to the echo server
        proxy.blackhole(True)
        proxy.set_delay_ms(20)
        forwarded = proxy.stats().bytes_forwarded
        sender = threading.Thread(target=s.sendall, args=(payload,), daemon=True)
        sender.start()
        peak = 0
        for _ in range(20):  # the proxy reads until the bound, then the sender is held by TCP
            time.sleep(0.05)
            peak = max(peak, proxy.stats().bytes_buffered)
        assert 0 < peak <= bound + READ_CHUNK_BYTES, f"held {peak} bytes (bound {bound})"
        assert proxy.stats().bytes_forwarded == forwarded, "bytes went through a blackhole"
        proxy.blackhole(False)
        got = bytearray()
        while len(got) < len(payload):
            chunk = s.recv(1 << 20)
            assert chunk, f"the echo ended after {len(got)} bytes"
            got += chunk
        sender.join(HEAL_S)
        assert bytes(got) == payload


def _echoes(proxy: DelayProxy) -> bool:
    """Whether a new connection through `proxy` gets its byte back (False: it was reset)."""
    try:
        with socket.create_connection((proxy.host, proxy.port), timeout=10) as s:
            s.sendall(b"?")
            return s.recv(1) == b"?"
    except ConnectionError:
        return False


def test_a_partition_resets_open_and_new_connections_until_healed(echo: tuple[str, int]) -> None:
    with DelayProxy(f"{echo[0]}:{echo[1]}") as proxy:  # "host:port", as members are written
        with socket.create_connection((proxy.host, proxy.port), timeout=10) as s:
            s.sendall(b"!")
            assert s.recv(1) == b"!"
            assert proxy.partition() == 1  # the one open connection, reset
            try:
                got = s.recv(1)
            except ConnectionError:
                got = b""
            assert got == b""
        assert not _echoes(proxy)  # accepted and reset at once, as a host answering RST
        refused = proxy.stats().connections_refused
        assert refused >= 1
        proxy.set_delay_ms(20)
        proxy.heal()  # no refusal, no delay, no blackhole
        started = time.monotonic()
        assert _echoes(proxy)
        assert time.monotonic() - started < HUNG_S
        assert proxy.stats().connections_refused == refused


def test_a_target_that_is_not_host_port_is_named() -> None:
    with pytest.raises(ProxyError, match="target: 'nowhere' must be host:port"):
        DelayProxy("nowhere")


def test_misuse_is_named() -> None:
    proxy = DelayProxy(("127.0.0.1", 9))
    with pytest.raises(ProxyError, match="not started"):
        proxy.address  # noqa: B018
    with pytest.raises(ProxyError, match="not running"):
        proxy.blackhole(True)
    with proxy:
        with pytest.raises(ProxyError, match="set_delay_ms"):
            proxy.set_delay_ms(-1)
    with pytest.raises(ProxyError, match="connections_max"):
        DelayProxy(("127.0.0.1", 9), connections_max=0)
    with pytest.raises(ProxyError, match="cannot listen"):
        with DelayProxy(("127.0.0.1", 9)) as taken:
            DelayProxy(("127.0.0.1", 9), ("127.0.0.1", taken.port)).start()


def test_the_public_api() -> None:
    assert set(faults.__all__) == {
        "BUFFERED_BYTES_MAX",
        "CONNECTIONS_MAX",
        "DELAY_MS_MAX",
        "NETNS_PER_PROCESS_MAX",
        "READ_CHUNK_BYTES",
        "DelayProxy",
        "Netns",
        "NetnsError",
        "NetnsUnavailable",
        "ProxyError",
        "ProxyStats",
        "check_available",
        "sweep_stale",
    }


# -- DelayProxy with gRPC (HTTP/2), used from inside a running asyncio program ------------------


async def _echo_unary(request: bytes, context: object) -> bytes:
    return request


async def _grpc_through_the_proxy() -> None:
    server = aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "t.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo_unary)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with DelayProxy(("127.0.0.1", port)) as proxy:
            async with aio.insecure_channel(proxy.address) as channel:
                echo = channel.unary_unary("/t.Echo/Echo")
                assert await echo(b"hello", timeout=10) == b"hello"
                proxy.set_delay_ms(200)
                t0 = time.monotonic()
                assert await echo(b"slow", timeout=10) == b"slow"
                assert time.monotonic() - t0 >= 0.2
                proxy.set_delay_ms(0)
                proxy.blackhole(True)
                with pytest.raises(aio.AioRpcError) as err:
                    await echo(b"lost", timeout=HUNG_S)
                assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                proxy.blackhole(False)
                assert await echo(b"back", timeout=HEAL_S) == b"back"
                proxy.cut()
                # A call sent before the channel has seen the reset fails UNAVAILABLE; then the
                # channel reconnects through the proxy.
                for _ in range(5):
                    try:
                        assert await echo(b"again", timeout=HEAL_S, wait_for_ready=True) == b"again"
                        break
                    except aio.AioRpcError as exc:
                        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                else:
                    pytest.fail("the channel did not reconnect through the proxy after a cut")
                assert proxy.stats().connections_accepted >= 2
    finally:
        await server.stop(0)


def test_grpc_through_the_proxy_with_a_delay_a_blackhole_and_a_cut() -> None:
    asyncio.run(_grpc_through_the_proxy())


# -- Netns (root; processes inside a namespace) ------------------------------------------------


@pytest.fixture
def netns_ok() -> None:
    """Skip without root, iproute2 or iptables; under CI=true, fail instead."""
    try:
        faults.check_available()
    except NetnsUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the namespace tests need root, iproute2 and iptables: {exc}")
        pytest.skip(str(exc))


@pytest.fixture
def netns(netns_ok: None) -> Iterator[Netns]:
    with Netns() as ns:
        yield ns


ECHO_SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    with c:
        while data := c.recv(65536):
            c.sendall(data)
"""

QUERY_LOOP = """
import sys, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True, connect_timeout=10)
print("connected", flush=True)
for line in sys.stdin:
    print(conn.execute("SELECT %s::int", (int(line),)).fetchone()[0], flush=True)
"""

QUERY_ONCE = """
import sys, psycopg
with psycopg.connect(sys.argv[1], connect_timeout=int(sys.argv[2])) as conn:
    print(conn.execute("SELECT 5").fetchone()[0])
"""


def _line(p: subprocess.Popen[str], timeout_s: float) -> str | None:
    """The next line `p` prints, or None if none comes within `timeout_s`."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout_s)
    return p.stdout.readline().strip() if ready else None


@pytest.mark.slow
def test_a_server_inside_is_reachable_from_the_host_until_a_partition(netns: Netns) -> None:
    p = netns.popen(
        [sys.executable, "-c", ECHO_SERVER, netns.ns_address], stdout=subprocess.PIPE, text=True
    )
    port = _line(p, HEAL_S)
    assert port, "the echo server inside did not start"
    with socket.create_connection((netns.ns_address, int(port)), timeout=10) as s:
        s.sendall(b"ping")
        assert s.recv(4) == b"ping"
    netns.partition(True)
    with pytest.raises(OSError):  # the SYN is dropped: no refusal, only the client's timeout
        socket.create_connection((netns.ns_address, int(port)), timeout=HUNG_S).close()
    netns.partition(False)
    with socket.create_connection((netns.ns_address, int(port)), timeout=10) as s:
        s.sendall(b"pong")
        assert s.recv(4) == b"pong"


@pytest.mark.slow
@pytest.mark.postgres
def test_psycopg_inside_reaches_postgres_through_proxy_to(netns: Netns, dsn: str) -> None:
    proxy = netns.proxy_to(PG)
    assert proxy.host == netns.host_address
    done = netns.run(
        [sys.executable, "-c", QUERY_ONCE, _via(proxy, dsn), "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "5"
    # 127.0.0.1 inside is the namespace's own loopback: PostgreSQL is not there.
    direct = netns.run(
        [sys.executable, "-c", QUERY_ONCE, dsn, "5"], capture_output=True, text=True, timeout=60
    )
    assert direct.returncode != 0


@pytest.mark.slow
@pytest.mark.postgres
def test_a_partition_hangs_the_query_inside_and_healing_completes_it(
    netns: Netns, dsn: str
) -> None:
    proxy = netns.proxy_to(PG)
    p = netns.popen(
        [sys.executable, "-c", QUERY_LOOP, _via(proxy, dsn)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdin is not None
    assert _line(p, HEAL_S) == "connected"
    p.stdin.write("1\n")
    p.stdin.flush()
    assert _line(p, HEAL_S) == "1"
    netns.partition(True)
    assert netns.partitioned
    p.stdin.write("2\n")
    p.stdin.flush()
    assert _line(p, HUNG_S) is None, "a query completed across the partition"
    fresh = netns.run(
        [sys.executable, "-c", QUERY_ONCE, _via(proxy, dsn), "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fresh.returncode != 0, "a new connection got through the partition"
    netns.partition(False)
    assert _line(p, HEAL_S) == "2", "the held query did not complete after healing"
    p.stdin.close()
    assert p.wait(HEAL_S) == 0


def _exists(name: str) -> bool:
    listed = subprocess.run(
        [faults.check_available()[0], "netns", "list"], capture_output=True, text=True, timeout=30
    ).stdout
    return any(line.split(" ", 1)[0] == name for line in listed.splitlines())


@pytest.mark.slow
@pytest.mark.usefixtures("netns_ok")
def test_cleanup_deletes_the_namespace_veth_and_processes_after_a_failure() -> None:
    with pytest.raises(RuntimeError, match="the body failed"):
        with Netns() as ns:
            name, veth = ns.name, ns.host_if
            p = ns.popen(["sleep", "600"])
            ns.partition(True)
            raise RuntimeError("the body failed")
    assert p.poll() is not None, "a process started inside outlived the namespace"
    assert not _exists(name)
    link = subprocess.run(
        [faults.check_available()[0], "link", "show", veth], capture_output=True, timeout=30
    )
    assert link.returncode != 0, f"the veth {veth} outlived the namespace"


@pytest.mark.slow
def test_namespaces_of_a_dead_process_are_swept(netns: Netns) -> None:
    ip = faults.check_available()[0]
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"govf-{dead.pid}-0"
    subprocess.run([ip, "netns", "add", stale], check=True, capture_output=True, timeout=30)
    try:
        assert stale in faults.sweep_stale()
        assert not _exists(stale)
        assert _exists(netns.name), "a live process's namespace was swept"
    finally:
        subprocess.run([ip, "netns", "del", stale], capture_output=True, timeout=30)


def test_a_missing_tool_or_root_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from governor.testing.faults._netns import tool

    with pytest.raises(NetnsUnavailable, match="`no-such-tool-here` is not installed"):
        tool("no-such-tool-here")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetnsUnavailable, match="need root"):
        Netns().create()
    with pytest.raises(faults.NetnsError, match="not created"):
        Netns().partition(True)

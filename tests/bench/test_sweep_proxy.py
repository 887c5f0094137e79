"""The delaying proxy as `mesh bench strict --sweep` uses it between workers and governord
(governor.testing.faults.DelayProxy with `set_delay_ms`): bytes arrive whole and in order,
each direction is held at least the delay, and a close on either side reaches the other,
after what was sent before it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from governor.testing.faults import DelayProxy

DELAY_MS = 30
TIMEOUT_S = 10.0


class Echo:
    """A TCP echo server on port 0: each connection's bytes back until its EOF, then a
    close; `eofs` counts the connections whose EOF it saw."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.eofs = 0
        self.eof = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    break
                if not data:
                    self.eofs += 1
                    self.eof.set()
                    break
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    yield server
    server.close()


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, f"EOF after {len(out)} of {n} bytes"
        out += chunk
    return out


def test_bytes_arrive_in_order_and_each_round_trip_takes_twice_the_delay(echo: Echo) -> None:
    with DelayProxy(echo.address) as proxy:
        proxy.set_delay_ms(DELAY_MS)
        with _connect(proxy.address) as s:
            sent = b"".join(b"%05d;" % i for i in range(2_000))
            for i in range(0, len(sent), 100):  # many small writes: many delayed chunks
                s.sendall(sent[i : i + 100])
            assert _read(s, len(sent)) == sent
            for _ in range(3):
                t0 = time.monotonic()
                s.sendall(b"ping")
                assert _read(s, 4) == b"ping"
                assert time.monotonic() - t0 >= 2 * DELAY_MS / 1000  # one delay each way


def test_a_half_close_reaches_the_far_side_after_the_bytes_before_it(echo: Echo) -> None:
    with DelayProxy(echo.address) as proxy:
        proxy.set_delay_ms(DELAY_MS)
        with _connect(proxy.address) as s:
            t0 = time.monotonic()
            s.sendall(b"last words")
            s.shutdown(socket.SHUT_WR)  # the echo sees EOF, echoes nothing more, closes
            assert echo.eof.wait(TIMEOUT_S) and echo.eofs == 1
            assert _read(s, 10) == b"last words"
            assert s.recv(1) == b""  # its close came back through the proxy, in order
            assert time.monotonic() - t0 >= 2 * DELAY_MS / 1000


def test_a_client_that_closes_is_seen_closed_by_the_server(echo: Echo) -> None:
    with DelayProxy(echo.address) as proxy:
        proxy.set_delay_ms(DELAY_MS)
        s = _connect(proxy.address)
        s.sendall(b"x")
        assert _read(s, 1) == b"x"
        s.close()
        assert echo.eof.wait(TIMEOUT_S) and echo.eofs == 1
        deadline = time.monotonic() + TIMEOUT_S
        while proxy.stats().connections_open and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.stats().connections_open == 0  # nothing left held open for it

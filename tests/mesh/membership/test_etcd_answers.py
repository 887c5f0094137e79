"""An etcd gateway whose answer is not a JSON object is refused by name (PeerRefused), not
trusted: a real HTTP server on loopback stands in for a broken gateway."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import pytest

from mesh.errors import PeerRefused
from mesh.membership import EtcdClient


class _Gateway(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, type[_Gateway]]]:
    handler = type("Gateway", (_Gateway,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "body, problem",
    [(b"[1, 2]", "answer is a JSON list, not an object"), (b"{nope", "answer is not JSON")],
)
def test_an_answer_that_is_not_an_object_is_refused(
    gateway: tuple[str, type[_Gateway]], body: bytes, problem: str
) -> None:
    url, handler = gateway
    handler.body = body

    async def main() -> None:
        client = EtcdClient((url,), timeout_s=2.0)
        try:
            with pytest.raises(PeerRefused) as err:
                await client.grant(5)
            assert err.value.field == "etcd/v3/lease/grant" and problem in str(err.value)
        finally:
            await client.close()

    asyncio.run(main())

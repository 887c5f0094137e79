"""governord's HTTP port (the ``metrics`` setting): a small HTTP/1.1 server on the event loop
for the pages in ``_routes``: Prometheus scrapes, Kubernetes probes, an operator's curl.

Only GET and HEAD, one request per connection (``Connection: close``), no request body. Every
size and wait has a named bound: the request head (``HEAD_BYTES_MAX``), the time to send it
(``HEAD_TIMEOUT_S``), the connections open at once (``CONNECTIONS_MAX``; more are answered 503
and closed) and the time a page may take (``PAGE_TIMEOUT_S``, then 503).
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus

from governor.config import ConfigError
from ratemesh.operator import probe_bind

from ._logs import event
from ._routes import Page, Reply, json_reply

__all__ = [
    "CONNECTIONS_MAX",
    "HEAD_BYTES_MAX",
    "HEAD_TIMEOUT_S",
    "PAGE_TIMEOUT_S",
    "HttpServer",
    "start_http",
]

HEAD_BYTES_MAX = 8192
HEAD_TIMEOUT_S = 5.0
PAGE_TIMEOUT_S = 10.0
CONNECTIONS_MAX = 64

log = logging.getLogger("governord.http")


class HttpServer:
    def __init__(self, pages: dict[str, Page]) -> None:
        self.pages = dict(pages)
        self.open = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self.address = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            if self.open > CONNECTIONS_MAX:
                self.refused += 1
                await self._send(writer, "GET", json_reply(503, {"error": "too many connections"}))
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                return  # gone, or too slow: nothing to answer
            except asyncio.LimitOverrunError:
                await self._send(
                    writer, "GET", json_reply(431, {"error": "request head too large"})
                )
                return
            method, reply = await self._answer(head)
            await self._send(writer, method, reply)
        finally:
            self.open -= 1
            writer.close()

    async def _answer(self, head: bytes) -> tuple[str, Reply]:
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return "GET", json_reply(400, {"error": "bad request line"})
        method, target = parts[0], parts[1]
        path = target.split("?", 1)[0]
        page = self.pages.get(path)
        if page is None:
            return method, json_reply(
                404, {"error": f"no page {path}", "pages": sorted(self.pages)}
            )
        if method not in ("GET", "HEAD"):
            return method, json_reply(405, {"error": f"{method} not allowed", "allow": "GET, HEAD"})
        try:
            return method, await asyncio.wait_for(page(), PAGE_TIMEOUT_S)
        except TimeoutError:
            return method, json_reply(503, {"error": f"{path} took over {PAGE_TIMEOUT_S} s"})
        except Exception as exc:  # a bug in a page: answer 500 and say so in the log
            log.exception("page %s failed", path, extra={"fields": {"path": path}})
            return method, json_reply(500, {"error": f"{path} failed: {type(exc).__name__}"})

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, method: str, reply: Reply) -> None:
        reason = HTTPStatus(reply.status).phrase
        head = (
            f"HTTP/1.1 {reply.status} {reason}\r\n"
            f"Content-Type: {reply.content_type}\r\n"
            f"Content-Length: {len(reply.body)}\r\n"
            "Cache-Control: no-store\r\n"
            "Connection: close\r\n"
            + ("Allow: GET, HEAD\r\n" if reply.status == 405 else "")
            + "\r\n"
        ).encode("latin-1")
        try:
            writer.write(head if method == "HEAD" else head + reply.body)
            await writer.drain()
        except ConnectionError:
            pass  # the client left; nothing to tell it

    async def start(self, address: str) -> str:
        """Listen on ``address``; the bound ``host:port`` (port 0 asks for a free one)."""
        probe_bind(address, field="metrics", error=ConfigError)
        host, _, port = address.rpartition(":")
        try:
            self._server = await asyncio.start_server(
                self._handle, host.strip("[]"), int(port), limit=HEAD_BYTES_MAX
            )
        except OSError as exc:
            raise ConfigError("metrics", f"cannot serve on {address}: {exc.strerror}") from exc
        bound = self._server.sockets[0].getsockname()
        self.address = f"{host}:{bound[1]}"
        event(log, logging.DEBUG, "http pages", address=self.address, pages=sorted(self.pages))
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def start_http(address: str, pages: dict[str, Page]) -> HttpServer:
    server = HttpServer(pages)
    await server.start(address)
    return server

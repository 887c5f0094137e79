"""governord's HTTP port (the ``metrics`` setting): a small HTTP/1.1 server on the event loop
for the pages in ``_routes``: Prometheus scrapes, Kubernetes probes, an operator's curl.

Only GET and HEAD, one request per connection (``Connection: close``), no request body. Every
size and wait has a named bound, so sockets that say nothing cannot take the port from a probe
(docs/security.md):

* the request head (``HEAD_BYTES_MAX``); its first byte within ``FIRST_BYTE_TIMEOUT_S`` of the
  accept, the whole head within ``HEAD_TIMEOUT_S``; else the socket is closed unanswered;
* connections: ``PEER_CONNECTIONS_MAX`` from one address, ``CONNECTIONS_MAX`` in all; at the
  bound a new connection evicts the oldest one still waiting for its head
  (``ratemesh.conngate``), and when every one is busy ``PROBE_RESERVE`` more answer
  ``/health/live`` and ``/health/ready`` only (the rest 503);
* the time a page may take (``PAGE_TIMEOUT_S``, then 503).

A page marked ``Guarded`` (per-tenant detail: /ui, /ui/status, /metrics' tenant series) is
served whole to a loopback caller or one that sends ``authorization: Bearer <pages token>``;
anyone else gets its public form (or 401).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from http import HTTPStatus

from governor.config import ConfigError
from ratemesh.checks import address_parts, with_port
from ratemesh.conngate import Admit, ConnGate, loopback_peer
from ratemesh.operator import probe_bind

from ._logs import event
from ._routes import Guarded, Page, Reply, json_reply

__all__ = [
    "CONNECTIONS_MAX",
    "FIRST_BYTE_TIMEOUT_S",
    "HEAD_BYTES_MAX",
    "HEAD_TIMEOUT_S",
    "PAGE_TIMEOUT_S",
    "PEER_CONNECTIONS_MAX",
    "PROBE_PATHS",
    "PROBE_RESERVE",
    "HttpServer",
    "start_http",
]

HEAD_BYTES_MAX = 8192
FIRST_BYTE_TIMEOUT_S = 2.0  # a probe or a scrape speaks at once
HEAD_TIMEOUT_S = 5.0  # the whole head, from the accept
PAGE_TIMEOUT_S = 10.0
CONNECTIONS_MAX = 64
PEER_CONNECTIONS_MAX = 16  # a scraper, a kubelet and an operator need a few each
PROBE_RESERVE = 8  # over CONNECTIONS_MAX, for liveness and readiness only
PROBE_PATHS = frozenset({"/health/live", "/health/ready"})
_BEARER = b"bearer "

log = logging.getLogger("governord.http")


class HttpServer:
    def __init__(self, pages: dict[str, Page]) -> None:
        self.pages = dict(pages)
        self.gate: ConnGate[asyncio.StreamWriter] = ConnGate(
            CONNECTIONS_MAX, PEER_CONNECTIONS_MAX, PROBE_RESERVE
        )
        self.timed_out = 0
        self._server: asyncio.Server | None = None
        self.address = ""

    @property
    def open(self) -> int:
        return self.gate.open

    @property
    def refused(self) -> int:
        return sum(self.gate.refused.values())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        admit, evicted = self.gate.opened(writer, peer)
        if evicted is not None:
            evicted.close()  # its read ends at once; its handler sees a closed socket
        try:
            if admit is Admit.REFUSED_PEER:
                return  # nothing answered: the peer holds its share already
            if admit is Admit.REFUSED_FULL:
                await self._send(writer, "GET", json_reply(503, {"error": "too many connections"}))
                return
            head = await self._head(reader, writer)
            if head is None:
                return
            self.gate.busy(writer)
            method, reply = await self._answer(head, peer, probes_only=admit is Admit.PROBES_ONLY)
            await self._send(writer, method, reply)
        finally:
            self.gate.closed(writer)
            writer.close()

    async def _head(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes | None:
        """The request head, or None (closed: silent, too slow, gone, or answered 431)."""
        t0 = time.monotonic()
        try:
            first = await asyncio.wait_for(reader.readexactly(1), FIRST_BYTE_TIMEOUT_S)
            left = HEAD_TIMEOUT_S - (time.monotonic() - t0)
            return first + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), max(left, 0.0))
        except TimeoutError:
            self.timed_out += 1
            return None
        except (asyncio.IncompleteReadError, ConnectionError):
            return None  # gone: nothing to answer
        except asyncio.LimitOverrunError:
            await self._send(writer, "GET", json_reply(431, {"error": "request head too large"}))
            return None

    async def _answer(self, head: bytes, peer: str, *, probes_only: bool) -> tuple[str, Reply]:
        lines = head.split(b"\r\n")
        parts = lines[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return "GET", json_reply(400, {"error": "bad request line"})
        method, target = parts[0], parts[1]
        path = target.split("?", 1)[0]
        if probes_only and path not in PROBE_PATHS:
            return method, json_reply(503, {"error": "busy: liveness and readiness only"})
        page = self.pages.get(path)
        if page is None:
            return method, json_reply(
                404, {"error": f"no page {path}", "pages": sorted(self.pages)}
            )
        if method not in ("GET", "HEAD"):
            return method, json_reply(405, {"error": f"{method} not allowed", "allow": "GET, HEAD"})
        if isinstance(page, Guarded) and not _may_read(page.tokens, peer, lines[1:]):
            if page.public is None:
                return method, json_reply(
                    401,
                    {
                        "error": f"{path} shows every tenant: ask from loopback, or send "
                        "authorization: Bearer <pages token> (pages.token_file)"
                    },
                )
            page = page.public
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
            + ("WWW-Authenticate: Bearer\r\n" if reply.status == 401 else "")
            + "\r\n"
        ).encode("latin-1")
        try:
            writer.write(head if method == "HEAD" else head + reply.body)
            await asyncio.wait_for(writer.drain(), PAGE_TIMEOUT_S)
        except (ConnectionError, TimeoutError):
            pass  # the client left, or does not read: nothing to tell it

    async def start(self, address: str) -> str:
        """Listen on ``address``; the bound ``host:port`` (port 0 asks for a free one)."""
        probe_bind(address, field="metrics", error=ConfigError)
        host, port = address_parts("metrics", address, allow_zero_port=True, error=ConfigError)
        try:
            self._server = await asyncio.start_server(
                self._handle, host, port, limit=HEAD_BYTES_MAX
            )
        except OSError as exc:
            raise ConfigError("metrics", f"cannot serve on {address}: {exc.strerror}") from exc
        bound = self._server.sockets[0].getsockname()
        self.address = with_port(address, bound[1])
        event(log, logging.DEBUG, "http pages", address=self.address, pages=sorted(self.pages))
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def _peer(writer: asyncio.StreamWriter) -> str:
    name = writer.get_extra_info("peername")
    return str(name[0]) if isinstance(name, tuple) and name else "?"


def _may_read(tokens: tuple[bytes, ...], peer: str, headers: list[bytes]) -> bool:
    """Per-tenant detail: a loopback caller, or a pages token sent as a bearer token."""
    if loopback_peer(peer):
        return True
    for line in headers:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"authorization":
            value = value.strip()
            if value[: len(_BEARER)].lower() != _BEARER:
                return False
            token = value[len(_BEARER) :].strip()
            # every token compared, whichever matches: no timing tells which one did
            return any([hmac.compare_digest(token, t) for t in tokens])
    return False


async def start_http(address: str, pages: dict[str, Page]) -> HttpServer:
    server = HttpServer(pages)
    await server.start(address)
    return server

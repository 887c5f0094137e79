"""A tiny asyncio HTTP/1.1 endpoint for /metrics and /health (GET only, one response per
connection): no web framework for two read-only pages."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

__all__ = ["HttpEndpoint", "Route"]

Route = Callable[[], tuple[int, str, bytes]]  # () -> (status, content type, body)
_REQUEST_MAX = 8192


class HttpEndpoint:
    def __init__(self, listen: str, routes: dict[str, Route]) -> None:
        self.listen = listen
        self.routes = routes
        self._server: asyncio.Server | None = None
        self.addr = ""

    async def start(self) -> str:
        host, _, port = self.listen.rpartition(":")
        self._server = await asyncio.start_server(self._serve, host.strip("[]"), int(port))
        sock = self._server.sockets[0].getsockname()
        self.addr = f"{host}:{sock[1]}"
        return self.addr

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            parts = head[:_REQUEST_MAX].split(b"\r\n", 1)[0].split()
            method = parts[0].decode() if parts else ""
            path = parts[1].decode().split("?", 1)[0] if len(parts) > 1 else ""
            route = self.routes.get(path)
            if method != "GET":
                status, ctype, body = 405, "text/plain", b"GET only\n"
            elif route is None:
                status, ctype, body = 404, "text/plain", b"not found\n"
            else:
                status, ctype, body = route()
            reason = {
                200: "OK",
                404: "Not Found",
                405: "Method Not Allowed",
                503: "Service Unavailable",
            }.get(status, "OK")
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
        ):
            pass
        finally:
            writer.close()

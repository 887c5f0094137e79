"""The HTTP front end: a small ASGI app served by uvicorn (httptools, on the node's own
loop), for the sidecar's JSON routes and the node's /metrics and /health.

    POST /v1/admit   {"tenant": "acme", "metric": "read_iops", "amount": 1}
                     -> 200 {"allowed": true, "reason": "admitted", "mode": ..., "bound": ...}
    POST /v1/admit   {"items": [{...}, ...]}  -> 200 {"verdicts": [{...}, ...]}
    POST /v1/charge  the same shapes (amount: the bytes or tokens)
    POST /v1/refund  one item -> 200 {"ok": true}; a batch -> 200 {"acks": [{"ok": ...}]}
    POST /v1/cooldown {"tenant", "metric", "cooldown_s"?} -> 200 {"ok": true}: the service
                     behind the limit said 429; the fleet backs off (docs/cooldown.md)
    GET  /metrics, GET /health   (the telemetry routes, `mesh.telemetry.telemetry_routes`)

A denial is an answer, not an HTTP error: 200 with `"allowed": false` (as the JSON
gateways of Envoy's and Gubernator's rate limit services answer), so a batch and a single
item read alike. A single item's mistake is 400 `{"error": "field: what was wrong"}`; in a
batch it is that item's verdict (`{"allowed": false, "error": ...}`), the rest decided.
Bad JSON, a body over `max_message_bytes` (413) or more than `items_max` items: 400 / 413,
nothing decided. A missing or wrong bearer token where one is needed: 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import uvicorn

from mesh.config import TlsConfig
from mesh.errors import ConfigError
from mesh.sidecar._auth import BearerCheck
from mesh.sidecar._items import Decider, Item, Outcome, verdict_fields
from mesh.telemetry import Route

__all__ = ["HttpApp", "HttpServer"]

log = logging.getLogger("mesh.sidecar")
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
_JSON = [(b"content-type", b"application/json")]
_ITEM_KEYS = frozenset({"tenant", "metric", "amount", "descriptors"})


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HttpApp:
    """The ASGI app. `decider` None: the telemetry routes only (a telemetry_listen apart
    from the sidecar's)."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        decider: Decider | None = None,
        *,
        items_max: int = 1000,
        body_max_bytes: int = 4 << 20,
        auth: BearerCheck | None = None,
    ) -> None:
        self.routes = dict(routes)
        self.decider = decider
        self.items_max = items_max
        self.body_max_bytes = body_max_bytes
        self.auth = auth or BearerCheck((), required=False)
        self.requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off; websockets are not served
            return
        self.requests += 1
        path, method = scope["path"], scope["method"]
        try:
            if path.startswith("/v1/") and self.decider is not None:
                if method != "POST":
                    raise _BadRequest(405, "method: POST only")
                status, body = await self._post(path[4:], scope, receive)
            elif path in self.routes:
                if method not in ("GET", "HEAD"):
                    raise _BadRequest(405, "method: GET only")
                code, ctype, data = self.routes[path]()
                await _respond(send, code, data, [(b"content-type", ctype.encode())])
                return
            else:
                raise _BadRequest(404, f"path: {path[:100]!r} is not served here")
        except _BadRequest as exc:
            status, body = exc.status, {"error": exc.message}
        headers = list(_JSON)
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        elif status == 405:
            headers.append((b"allow", b"POST" if path.startswith("/v1/") else b"GET, HEAD"))
        await _respond(send, status, json.dumps(body).encode(), headers)

    async def _post(self, route: str, scope: Scope, receive: Receive) -> tuple[int, Any]:
        assert self.decider is not None
        if route not in ("admit", "charge", "refund", "cooldown"):
            raise _BadRequest(404, f"path: /v1/{route[:100]} is not served here")
        if self.auth.required:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            why = self.auth(header)
            if why is not None:
                raise _BadRequest(401, why)
        doc = _json(await self._body(receive))
        if route == "cooldown":
            if not isinstance(doc, dict) or set(doc) - {"tenant", "metric", "cooldown_s"}:
                raise _BadRequest(400, "body: must be {tenant, metric, cooldown_s?}")
            why = self.decider.cooldown(
                doc.get("tenant"), doc.get("metric"), doc.get("cooldown_s", 90.0)
            )
            if why is not None:
                raise _BadRequest(400, why)
            return 200, {"ok": True}
        batch = isinstance(doc, dict) and "items" in doc
        items = self._batch(doc) if batch else [_item(doc, "")]
        if route == "refund":
            errors = self.decider.refund(items)
            if not batch:
                if errors[0] is not None:
                    raise _BadRequest(400, errors[0])
                return 200, {"ok": True}
            return 200, {"acks": [{"ok": True} if e is None else _ack(e) for e in errors]}
        outcomes = self.decider.admit(items, charge=route == "charge")
        if not batch:
            o = outcomes[0]
            if isinstance(o, str):
                raise _BadRequest(400, o)
            return 200, verdict_fields(*o)
        return 200, {"verdicts": [_outcome(o) for o in outcomes]}

    async def _body(self, receive: Receive) -> bytes:
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise _BadRequest(400, "body: the client went away")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.body_max_bytes:
                raise _BadRequest(413, f"body: larger than {self.body_max_bytes} bytes")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)

    def _batch(self, doc: dict[str, Any]) -> list[Item]:
        stray = sorted(set(doc) - {"items"})
        if stray:
            raise _BadRequest(400, f"{stray[0][:64]}: unknown field (a batch has only items)")
        raw = doc["items"]
        if not isinstance(raw, list):
            raise _BadRequest(400, "items: must be a list of items")
        if len(raw) > self.items_max:
            raise _BadRequest(
                400, f"items: {len(raw)} in one call; at most {self.items_max} (split the batch)"
            )
        return [_item(it, f"items[{i}].") for i, it in enumerate(raw)]


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _BadRequest(400, f"body: not JSON ({str(exc)[:120]})") from None


def _item(doc: Any, where: str) -> Item:
    """An item's shape (a JSON object with known keys); its values are the decider's to
    check, per item. A wrong shape refuses the whole call."""
    if not isinstance(doc, dict):
        what = where.rstrip(".") or "body"
        raise _BadRequest(400, f"{what}: must be a JSON object with tenant and metric")
    stray = sorted(set(doc) - _ITEM_KEYS)
    if stray:
        raise _BadRequest(
            400,
            f"{where}{str(stray[0])[:64]}: unknown field; expected tenant, metric, "
            "amount, descriptors",
        )
    desc = doc.get("descriptors", [])
    pairs: list[tuple[Any, Any]] = []
    if isinstance(desc, dict):  # {"key": "value"} reads naturally in JSON
        pairs = list(desc.items())
    elif isinstance(desc, list):
        for i, d in enumerate(desc):
            if not isinstance(d, dict) or set(d) != {"key", "value"}:
                raise _BadRequest(400, f"{where}descriptors[{i}]: must be {{key, value}}")
            pairs.append((d["key"], d["value"]))
    else:
        raise _BadRequest(400, f"{where}descriptors: must be an object or a list of {{key, value}}")
    amount = doc.get("amount", 1)
    if type(amount) is bool:  # JSON true is not 1
        amount = "bool"
    return Item(doc.get("tenant"), doc.get("metric"), amount, pairs)


def _outcome(o: Outcome) -> dict[str, Any]:
    if isinstance(o, str):
        return {"allowed": False, "error": o}
    return verdict_fields(*o)


def _ack(error: str) -> dict[str, Any]:
    return {"ok": False, "error": error}


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Server(uvicorn.Server):
    """uvicorn on a loop it does not own: the node handles signals (SIGTERM, SIGHUP)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class HttpServer:
    """uvicorn serving `app` on `listen` (port 0: any free port, read back)."""

    def __init__(
        self,
        app: HttpApp,
        listen: str,
        *,
        field: str,
        concurrent_max: int,
        tls: TlsConfig | None = None,
        drain_s: float = 1.0,
    ) -> None:
        self.app = app
        self.listen = listen
        self.field = field
        self.concurrent_max = concurrent_max
        self.tls = tls
        self.drain_s = drain_s
        self.address = ""
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        host, _, port = self.listen.rpartition(":")
        bare = host.strip("[]")
        family = socket.AF_INET6 if ":" in bare else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((bare, int(port)))
        except OSError as exc:
            sock.close()
            raise ConfigError(
                self.field, f"cannot serve on {self.listen}: {exc.strerror or exc}"
            ) from exc
        sock.set_inheritable(True)
        self.address = f"{host}:{sock.getsockname()[1]}"
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {"ssl_certfile": self.tls.cert, "ssl_keyfile": self.tls.key}
            if self.tls.ca is not None:
                tls["ssl_ca_certs"] = self.tls.ca
            if self.tls.require_client_cert:
                tls["ssl_cert_reqs"] = ssl.CERT_REQUIRED
        config = uvicorn.Config(
            self.app,
            http="httptools",
            ws="none",
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            server_header=False,
            date_header=False,
            limit_concurrency=self.concurrent_max,
            timeout_graceful_shutdown=max(int(self.drain_s), 1),
            **tls,
        )
        server = _Server(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name=self.field)
        while not server.started:  # startup binds nothing: it listens on our socket
            if self._task.done():
                self._task.result()
                raise ConfigError(self.field, f"cannot serve on {self.listen}")
            await asyncio.sleep(0.005)
        return self.address

    async def stop(self) -> None:
        """Stop accepting, close idle keep-alive connections, drain, then cancel."""
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self.drain_s + 1.0)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._server = self._task = None

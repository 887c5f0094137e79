"""The HTTP front end: a small ASGI app served by uvicorn (httptools, on the node's own
loop), for the sidecar's JSON routes and the node's /metrics and /health.

    POST /v1/admit   {"tenant": "acme", "metric": "read_iops", "amount": 1}
                     -> 200 {"allowed": true, "reason": "admitted", "mode": ..., "bound": ...}
    POST /v1/admit   {"items": [{...}, ...]}  -> 200 {"verdicts": [{...}, ...]}
    POST /v1/admit   ... "timeout_ms": 500 beside the item or the items: wait up to that
                     long where waiting helps (`mesh.sidecar._wait`), then answer
    POST /v1/charge  the same shapes (amount: the bytes or tokens)
    POST /v1/refund  one item -> 200 {"ok": true}; a batch -> 200 {"acks": [{"ok": ...}]}
    POST /v1/cooldown {"tenant", "metric", "cooldown_s"?} -> 200 {"ok": true}: the service
                     behind the limit said 429; the fleet backs off (docs/cooldown.md).
                     Needs `x-ratemesh-token`: the operator's or the tenant's own token
    DELETE /v1/cooldown {"tenant", "metric"} -> 200 {"ok": true}: the cooldown ends
    GET  /metrics, GET /health   (the telemetry routes, `mesh.telemetry.telemetry_routes`)

A denial is an answer, not an HTTP error: 200 with `"allowed": false` (as the JSON gateways
of Envoy's and Gubernator's rate limit services answer), so a batch and a single item read
alike; a node with `sidecar.http_status_on_deny: 429`, or a request with
`x-ratemesh-deny-status: 429`, gets a single item's denial as 429 with `Retry-After`. A
single verdict carries the RateLimit-Policy and RateLimit fields (`_ratelimit`); every
decided verdict its policy's exact `rate`, `window` and `burst`. Amount 0 is a peek. A
single item's mistake is 400 `{"error": "field: what was wrong"}`; in a batch it is that
item's verdict (`{"allowed": false, "error": ...}`), the rest decided. Bad JSON (nested too
deeply too), a body over `max_message_bytes` (413) or more than `items_max` items: 400 /
413, nothing decided. A body not in within `BODY_TIMEOUT_S`: 408. A missing or wrong bearer
token where one is needed: 401.

Connections (docs/security.md): each server keeps `ratemesh.conngate`'s bounds, so silent or
slow sockets cannot take it from a probe: at most `peer_connections_max` from one address
and `concurrent_max` in all (at the bound a new connection evicts the oldest one still
waiting for its request head), `PROBE_RESERVE` more answering only `PROBE_PATHS` when every
slot is busy, and a request head complete within `HEAD_TIMEOUT_S` of the accept (or of the
last response on a kept-alive connection), else the socket is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mesh.config import TlsConfig
from mesh.errors import ConfigError
from mesh.sidecar._auth import BearerCheck
from mesh.sidecar._items import Decided, Decider, Item, limit_fields, verdict_fields
from mesh.sidecar._ratelimit import DENY_STATUS_HEADER, ceil_s, deny_status, ratelimit_fields
from mesh.sidecar._slots import SLOT_ROUTES, SlotKeeper, SlotTokens, client_of
from mesh.sidecar._wait import timeout_problem, waiting_for
from mesh.telemetry import Detail, Route
from ratemesh.checks import address_parts, with_port
from ratemesh.conngate import Admit, ConnGate, loopback_peer
from ratemesh.policy import TenantRatePolicy

__all__ = [
    "BODY_TIMEOUT_S",
    "DEFAULT_COOLDOWN_S",
    "Access",
    "HEAD_TIMEOUT_S",
    "PROBE_PATHS",
    "PROBE_RESERVE",
    "HttpApp",
    "HttpServer",
]

HEAD_TIMEOUT_S = 5.0  # accept (or the last response) to a complete request head
BODY_TIMEOUT_S = 10.0  # request head to the body's last byte
IDLE_TIMEOUT_S = 5  # a kept-alive connection with no new request (uvicorn's timer)
PROBE_RESERVE = 16  # connections over concurrent_max that answer PROBE_PATHS only
PROBE_PATHS = frozenset({"/health"})

log = logging.getLogger("mesh.sidecar")
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
_JSON = [(b"content-type", b"application/json")]
_ITEM_KEYS = frozenset({"tenant", "metric", "amount", "descriptors"})


DEFAULT_COOLDOWN_S = 90.0  # when a caller names no cooldown_s (seed 003's 90 s)


class Access:
    """Who may read per-tenant detail and cool a limit (docs/security.md): the operator's
    token (both, any tenant with a policy), a tenant's own token (its own limits' cooldown),
    and any loopback caller (reads only)."""

    def __init__(
        self,
        operator_tokens: tuple[bytes, ...] = (),
        tenant_tokens: Mapping[str, bytes] | None = None,
        cooldown_max_s: float = 300.0,
    ) -> None:
        self.operator_tokens = operator_tokens
        self.tenant_tokens = dict(tenant_tokens or {})
        self.cooldown_max_s = cooldown_max_s

    @property
    def cooldown_open(self) -> bool:
        return bool(self.operator_tokens or self.tenant_tokens)

    def may_read(self, scope: Scope) -> bool:
        client = scope.get("client")
        if client and loopback_peer(str(client[0])):
            return True
        header = _header(scope, b"authorization")
        if header is None or header[:7].lower() != b"bearer ":
            return False
        return _matches(header[7:].strip(), self.operator_tokens)

    def may_cool(self, token: bytes, tenant: Any) -> bool:
        own = self.tenant_tokens.get(tenant) if isinstance(tenant, str) else None
        # every token compared, whichever matches: no timing tells which one did
        return _matches(token, (*self.operator_tokens, *((own,) if own else ())))


def _matches(token: bytes, tokens: tuple[bytes, ...]) -> bool:
    return any([hmac.compare_digest(token, t) for t in tokens])


def _header(scope: Scope, name: bytes) -> bytes | None:
    value = next((v for k, v in scope["headers"] if k == name), None)
    return None if value is None or len(value) > _TOKEN_MAX_BYTES else value.strip()


_TOKEN_MAX_BYTES = 4096


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
        access: Access | None = None,
        status_on_deny: int = 200,
    ) -> None:
        self.routes = dict(routes)
        self.status_on_deny = status_on_deny
        self.decider = decider
        self.items_max = items_max
        self.body_max_bytes = body_max_bytes
        self.auth = auth or BearerCheck((), required=False)
        self.access = access or Access()
        self.requests = 0
        self.slot_tokens: SlotTokens | None = None  # slot tokens, on the first acquire

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off; websockets are not served
            return
        self.requests += 1
        path, method = scope["path"], scope["method"]
        try:
            if path.startswith("/v1/") and self.decider is not None:
                if method != "POST" and not (method == "DELETE" and path == "/v1/cooldown"):
                    raise _BadRequest(405, "method: POST only")
                status, body, extra = await self._post(path[4:], scope, receive)
            elif path in self.routes:
                if method not in ("GET", "HEAD"):
                    raise _BadRequest(405, "method: GET only")
                route = self.routes[path]
                if isinstance(route, Detail) and not self.access.may_read(scope):
                    if route.public is None:
                        raise _BadRequest(
                            401,
                            f"{path} names every tenant: ask from loopback, or send "
                            "authorization: Bearer <operator token>",
                        )
                    route = route.public
                code, ctype, data = route()
                await _respond(send, code, data, [(b"content-type", ctype.encode())])
                return
            else:
                raise _BadRequest(404, f"path: {path[:100]!r} is not served here")
        except _BadRequest as exc:
            status, body, extra = exc.status, {"error": exc.message}, []
        headers = [*_JSON, *extra]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        elif status == 405:
            allow = b"POST, DELETE" if path == "/v1/cooldown" else b"POST"
            headers.append((b"allow", allow if path.startswith("/v1/") else b"GET, HEAD"))
        await _respond(send, status, json.dumps(body).encode(), headers)

    async def _post(
        self, route: str, scope: Scope, receive: Receive
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        """(status, body, headers beside content-type) of a /v1/ route."""
        assert self.decider is not None
        if route not in ("admit", "charge", "refund", "cooldown") and route not in SLOT_ROUTES:
            raise _BadRequest(404, f"path: /v1/{route[:100]} is not served here")
        if self.auth.required:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            why = self.auth(header)
            if why is not None:
                raise _BadRequest(401, why)
        if route == "cooldown":
            return *await self._cooldown(scope, receive), []
        if route in SLOT_ROUTES:  # in-flight slots (mesh.sidecar._slots)
            return await self._slot_call(route, scope, receive)
        status_on_deny = deny_status(_header(scope, DENY_STATUS_HEADER), self.status_on_deny)
        if isinstance(status_on_deny, str):
            raise _BadRequest(400, status_on_deny)
        doc = _json(await self._body(receive))
        timeout_ms = 0
        if isinstance(doc, dict) and "timeout_ms" in doc and route != "refund":
            timeout_ms = doc.pop("timeout_ms")
            why = timeout_problem(timeout_ms)
            if why is not None:
                raise _BadRequest(400, why)
        batch = isinstance(doc, dict) and "items" in doc
        items = self._batch(doc) if batch else [_item(doc, "")]
        if route == "refund":
            errors = self.decider.refund(items)
            if not batch:
                if errors[0] is not None:
                    raise _BadRequest(400, errors[0])
                return 200, {"ok": True}, []
            return 200, {"acks": [{"ok": True} if e is None else _ack(e) for e in errors]}, []
        charge = route == "charge"
        if timeout_ms:
            waiting = waiting_for(self.decider)
            outcomes = await waiting.admit(
                self.decider, items, charge=charge, timeout_ms=timeout_ms
            )
        else:
            outcomes = self.decider.admit(items, charge=charge)
        if not batch:
            o = outcomes[0]
            if isinstance(o, str):
                raise _BadRequest(400, o)
            return self._single(items[0], o, status_on_deny)
        verdicts = [_outcome(o) if isinstance(o, str) else self._fields(it, o)[0]
                    for it, o in zip(items, outcomes, strict=True)]  # fmt: skip
        return 200, {"verdicts": verdicts}, []

    async def _slot_call(
        self, route: str, scope: Scope, receive: Receive
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        """POST /v1/acquire and /v1/release: a slot token, taken or given back."""
        assert self.decider is not None
        if self.slot_tokens is None:
            self.slot_tokens = SlotTokens(cast(SlotKeeper, self.decider.admitter))
        client = client_of(_header(scope, b"authorization"), str((scope.get("client") or ("",))[0]))
        doc = _json(await self._body(receive))
        try:
            if route == "release":
                return 200, {"ok": self.slot_tokens.release(client, doc)}, []
            out = self.slot_tokens.acquire(client, doc)
        except ConfigError as exc:
            raise _BadRequest(400, str(exc)) from exc
        on_deny = deny_status(_header(scope, DENY_STATUS_HEADER), self.status_on_deny)
        if isinstance(on_deny, str):
            raise _BadRequest(400, on_deny)
        return (200 if out["allowed"] or on_deny == 200 else 429), out, []

    def _fields(self, item: Item, o: Decided) -> tuple[dict[str, Any], TenantRatePolicy | None]:
        """A decided item's wire fields, with its policy's exact limit (`limit_fields`),
        and that policy (None: no policy applied)."""
        assert self.decider is not None
        fields = verdict_fields(*o)
        policy = None if o[0].mode is None else self.decider.policy(item)
        if policy is not None:
            fields.update(limit_fields(policy))
        return fields, policy

    def _single(
        self, item: Item, o: Decided, status_on_deny: int
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        """One verdict: its fields, its RateLimit fields, and a denial's status."""
        assert self.decider is not None
        fields, policy = self._fields(item, o)
        headers = [] if policy is None else ratelimit_fields(item.metric, policy, fields)
        if fields["allowed"] or status_on_deny == 200:
            return 200, fields, headers
        retry_ms = fields.get("retry_after_ms")
        if retry_ms is not None:  # absent: waiting cannot help, so no time is promised
            headers.append((b"retry-after", str(ceil_s(retry_ms)).encode()))
        return 429, fields, headers

    async def _cooldown(self, scope: Scope, receive: Receive) -> tuple[int, Any]:
        """POST: cool (tenant, metric) fleet-wide; DELETE: end its cooldown here and at its
        owner (docs/cooldown.md). The token (operator's, or the tenant's own) is checked
        against the tenant named in the body before anything changes."""
        assert self.decider is not None
        if not self.access.cooldown_open:
            raise _BadRequest(
                403,
                "cooldown: no operator_token_file or tenant_tokens are configured on this "
                "node, so no caller may cool a limit",
            )
        token = _header(scope, b"x-ratemesh-token")
        if token is None:
            raise _BadRequest(401, "x-ratemesh-token: required (the operator's or the tenant's)")
        doc = _json(await self._body(receive))
        clear = scope["method"] == "DELETE"
        keys = {"tenant", "metric"} if clear else {"tenant", "metric", "cooldown_s"}
        if not isinstance(doc, dict) or set(doc) - keys:
            shape = "{tenant, metric}" if clear else "{tenant, metric, cooldown_s?}"
            raise _BadRequest(400, f"body: must be {shape}")
        tenant = doc.get("tenant")
        if not self.access.may_cool(token, tenant):
            raise _BadRequest(
                403, "x-ratemesh-token: neither the operator's token nor this tenant's"
            )
        if clear:
            why = self.decider.clear_cooldown(tenant, doc.get("metric"))
        else:
            cooldown_s = doc.get("cooldown_s", min(DEFAULT_COOLDOWN_S, self.access.cooldown_max_s))
            why = self.decider.cooldown(
                tenant, doc.get("metric"), cooldown_s, max_s=self.access.cooldown_max_s
            )
        if why is not None:
            raise _BadRequest(400, why)
        return 200, {"ok": True}

    async def _body(self, receive: Receive) -> bytes:
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                return await self._read_body(receive)
        except TimeoutError:
            raise _BadRequest(408, f"body: not sent within {BODY_TIMEOUT_S} s") from None

    async def _read_body(self, receive: Receive) -> bytes:
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
    """The body decoded. The decoder recurses once per nesting level and stops at the
    interpreter's recursion limit, so a deeply nested body costs no more than its bytes and
    is a 400 like any other bad JSON (never a 500 with a traceback)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise _BadRequest(400, "body: JSON nested too deeply") from None
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


def _outcome(error: str) -> dict[str, Any]:
    return {"allowed": False, "error": error}


def _ack(error: str) -> dict[str, Any]:
    return {"ok": False, "error": error}


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _busy(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer on a reserve connection to anything but a probe."""
    body = json.dumps({"error": "busy: only the health probe is answered"}).encode()
    await _respond(send, 503, body, list(_JSON))


class _GuardedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol under a `ConnGate` (set on a per-server subclass), with
    the head timer uvicorn lacks: a connection is closed unless its request head is
    complete within HEAD_TIMEOUT_S of the accept or of its last response."""

    gate: ConnGate[_GuardedProtocol]
    head_timeout_s: float = HEAD_TIMEOUT_S
    probes_only = False
    _head_timer: asyncio.TimerHandle | None = None
    timed_out = 0  # per server class: heads not in within the timeout

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        admit, evicted = self.gate.opened(self, self.client[0] if self.client else "?")
        if evicted is not None:
            evicted.drop()
        if admit in (Admit.REFUSED_PEER, Admit.REFUSED_FULL):
            transport.close()
            return
        self.probes_only = admit is Admit.PROBES_ONLY
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        type(self).timed_out += 1
        self.drop()

    def drop(self) -> None:
        """Close it now (evicted, or too slow): nothing is answered."""
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._disarm()
        self.gate.busy(self)
        if self.probes_only:
            path = httptools.parse_url(self.url).path.decode("latin-1")
            self.app = self.config.loaded_app if path in PROBE_PATHS else _busy
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.gate.idle(self)
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.gate.closed(self)
        super().connection_lost(exc)


class _Server(uvicorn.Server):
    """uvicorn on a loop it does not own: the node handles signals (SIGTERM, SIGHUP)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class HttpServer:
    """uvicorn serving `app` on `listen` (port 0: any free port, read back), its connections
    under `gate` (`concurrent_max` in all, `peer_connections_max` from one address)."""

    def __init__(
        self,
        app: HttpApp,
        listen: str,
        *,
        field: str,
        concurrent_max: int,
        peer_connections_max: int | None = None,
        tls: TlsConfig | None = None,
        drain_s: float = 1.0,
    ) -> None:
        self.app = app
        self.listen = listen
        self.field = field
        self.concurrent_max = concurrent_max
        self.gate: ConnGate[_GuardedProtocol] = ConnGate(
            concurrent_max,
            concurrent_max if peer_connections_max is None else peer_connections_max,
            PROBE_RESERVE,
        )
        self.protocol = type("GuardedProtocol", (_GuardedProtocol,), {"gate": self.gate})
        self.tls = tls
        self.drain_s = drain_s
        self.address = ""
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        host, port = address_parts(self.field, self.listen, allow_zero_port=True, error=ConfigError)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ConfigError(
                self.field, f"cannot serve on {self.listen}: {exc.strerror or exc}"
            ) from exc
        sock.set_inheritable(True)
        self.address = with_port(self.listen, sock.getsockname()[1])
        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {"ssl_certfile": self.tls.cert, "ssl_keyfile": self.tls.key}
            if self.tls.ca is not None:
                tls["ssl_ca_certs"] = self.tls.ca
            if self.tls.require_client_cert:
                tls["ssl_cert_reqs"] = ssl.CERT_REQUIRED
        config = uvicorn.Config(
            self.app,
            http=self.protocol,
            ws="none",
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            server_header=False,
            date_header=False,
            limit_concurrency=None,  # the gate bounds connections, so requests too
            timeout_keep_alive=IDLE_TIMEOUT_S,
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

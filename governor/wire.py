"""governord's wire schema, shared by the server and the SDK: one gRPC service, msgpack bodies.

Every call is ``/governor.v1.Governor/<Method>``; request and reply are msgpack maps with string
keys. A request carries ``v`` (the schema version, 1); unknown keys are refused, so a typo is a
clear INVALID_ARGUMENT instead of a silently ignored field. Credentials travel in metadata:
``x-governor-key`` (a tenant's API key) or ``x-governor-token`` (a session token). An error is a
standard gRPC status; its trailing metadata ``governor-error-bin`` is a msgpack map
``{reason, message, field?, denial?, end?}``. The full schema is written down in
``docs/governor-api.md``; the table below is what the code checks.

``Multiplex`` is one bidirectional stream that carries batches of the short calls, each with
its own id: one gRPC message costs about as much CPU as one unary call, so coalescing many
calls per message is what lets one client with many concurrent callers go fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from ratemesh.unpack import UnpackBounds, unpackb

__all__ = [
    "CALLS_PER_BATCH_MAX",
    "ERROR_MD",
    "KEY_MD",
    "METHODS",
    "MULTIPLEX",
    "MUX_BODY_MAX",
    "SCHEMA_VERSION",
    "SERVICE",
    "TOKEN_MD",
    "Method",
    "Muxed",
    "WireError",
    "check_batch",
    "check_request",
    "pack",
    "pack_batch",
    "path",
    "unpack",
]

SERVICE = "governor.v1.Governor"
SCHEMA_VERSION = 1
KEY_MD = "x-governor-key"
TOKEN_MD = "x-governor-token"
ERROR_MD = "governor-error-bin"
# The reason a standby (or a deposed leader) gives, with ``leader``: the address that leads,
# "" while an election is under way (docs/failover.md).
NOT_LEADER = "not_leader"
MESSAGE_BYTES_MAX = 1 << 20
MULTIPLEX = "Multiplex"
CALLS_PER_BATCH_MAX = 4096
MUX_BODY_MAX = 256 << 10  # a larger request travels as its own unary call
# What one message may build beyond its bytes (ratemesh.unpack): a full batch is
# CALLS_PER_BATCH_MAX calls of a few fields each; a reply lists at most thousands of nodes.
MESSAGE_OBJECTS_MAX = 262_144
_BOUNDS = UnpackBounds(
    objects_max=MESSAGE_OBJECTS_MAX,
    container_max=65_536,
    str_max=MESSAGE_BYTES_MAX,
    bin_max=MESSAGE_BYTES_MAX,
)

# Field kinds: int, int? (int or nil), str, str?, bool, caps? (map str -> int or nil),
# caps (map str -> int), defaults? (a Defaults map, see the document), tokens? (nothing else),
# rates? (map str -> [per_s, burst], two ints: a rated quota node's bucket).
_Fields = dict[str, str]


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    fields: _Fields
    auth: str  # "key" (API key only), "token" (session token), "key_or_token"
    stream: bool = False  # server-streaming reply
    mutates: bool = True  # takes a request_id
    muxable: bool = True  # may travel on Multiplex (not the waiting or streaming calls)


def _m(name: str, fields: _Fields, auth: str = "token", **kw: Any) -> Method:
    return Method(name, fields, auth, **kw)


_NODE_SPEC: _Fields = {
    "parent_id": "int?",
    "name": "str",
    "quotas": "caps?",
    "limits": "caps?",
    "weight": "int?",
    "priority": "int?",
    "deadline_ms": "int?",
    "defaults": "defaults?",
    "request_id": "str?",
    "rates": "rates?",
}

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        _m("OpenSession", {"ttl_ms": "int?"}, "key", mutates=False),
        _m("Heartbeat", {}, mutates=False),
        _m("CloseSession", {}, mutates=False),
        _m("CreateNode", _NODE_SPEC),
        _m("EnsureNode", _NODE_SPEC, "key_or_token"),
        _m("GetNode", {"node_id": "int?"}, mutates=False),
        _m("CancelNode", {"node_id": "int", "request_id": "str?"}),
        _m("CloseNode", {"node_id": "int", "request_id": "str?"}),
        _m("WatchNode", {"node_id": "int"}, stream=True, mutates=False, muxable=False),
        _m(
            "Consume",
            {"node_id": "int", "resource": "str", "amount": "int?", "request_id": "str?"},
            "key_or_token",
        ),
        _m(
            "Acquire",
            {"node_id": "int", "cls": "str", "timeout_ms": "int?", "request_id": "str?"},
            muxable=False,  # waits in the fair queue; cancelling its call withdraws the wait
        ),
        _m(
            "Release",
            {
                "lease_id": "int",
                "latency_ms": "int?",
                "overloaded": "bool?",
                "request_id": "str?",
            },
        ),
        _m("Validate", {"lease_id": "int"}, mutates=False),
        _m(
            "SetQuota",
            {"node_id": "int", "resource": "str", "limit": "int?", "request_id": "str?"},
        ),
        _m("SetLimit", {"node_id": "int", "cls": "str", "limit": "int?", "request_id": "str?"}),
        _m("SetDefaults", {"node_id": "int", "defaults": "defaults?", "request_id": "str?"}),
        _m(
            "SetCooldown",
            {
                "node_id": "int",
                "name": "str",
                "duration_ms": "int",
                "replace": "bool?",
                "request_id": "str?",
            },
        ),
        _m(
            "ReserveCredit",
            {"node_id": "int", "resource": "str", "units": "int", "request_id": "str?"},
        ),
        _m("ReturnCredit", {"block_id": "int", "unused": "int", "request_id": "str?"}),
        _m(
            "SetRate",
            {
                "node_id": "int",
                "resource": "str",
                "per_s": "int?",
                "burst": "int?",
                "request_id": "str?",
            },
        ),
    )
}


class WireError(ValueError):
    """A message that does not match the schema; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def path(method: str) -> str:
    return f"/{SERVICE}/{method}"


def pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def unpack(data: bytes) -> Any:
    try:
        return unpackb(data, _BOUNDS)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError("body", f"not a msgpack message: {exc}") from exc


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_caps(field: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise WireError(field, "must be a map of name to int")
    for k, v in value.items():
        if not isinstance(k, str) or not (v is None or _is_int(v)):
            raise WireError(f"{field}[{k!r}]", "must map a name to an int (or nil)")


def _check_defaults(field: str, value: Any, depth: int = 0) -> None:
    if not isinstance(value, dict):
        raise WireError(field, "must be a map")
    if depth > 8:
        raise WireError(field, "defaults nest at most 8 levels")
    allowed = {"quotas", "limits", "weight", "priority", "children"}
    for k, v in value.items():
        if k not in allowed:
            raise WireError(f"{field}.{k}", "unknown key")
        if v is None:
            continue
        if k in ("quotas", "limits"):
            _check_caps(f"{field}.{k}", v)
        elif k in ("weight", "priority") and not _is_int(v):
            raise WireError(f"{field}.{k}", "must be an int")
        elif k == "children":
            _check_defaults(f"{field}.children", v, depth + 1)


def _check_rates(field: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise WireError(field, "must be a map of resource to [per_s, burst]")
    for k, v in value.items():
        ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_int(x) for x in v)
        if not isinstance(k, str) or not ok:
            raise WireError(f"{field}[{k!r}]", "must map a resource to [per_s, burst], two ints")


def check_request(method: Method, body: Any) -> dict[str, Any]:
    """Validate a decoded request against the schema; returns the map with defaults filled."""
    if not isinstance(body, dict):
        raise WireError("body", "must be a msgpack map")
    version = body.get("v")
    if version != SCHEMA_VERSION:
        raise WireError("v", f"schema version must be {SCHEMA_VERSION}, got {version!r}")
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key == "v":
            continue
        kind = method.fields.get(key) if isinstance(key, str) else None
        if kind is None:
            raise WireError(str(key), f"unknown field for {method.name}")
        optional = kind.endswith("?")
        base = kind.rstrip("?")
        if value is None:
            if not optional:
                raise WireError(key, "is required")
            out[key] = None
            continue
        if base == "int" and not _is_int(value):
            raise WireError(key, f"must be an int, got {type(value).__name__}")
        if base == "str" and not isinstance(value, str):
            raise WireError(key, f"must be a string, got {type(value).__name__}")
        if base == "bool" and not isinstance(value, bool):
            raise WireError(key, f"must be a bool, got {type(value).__name__}")
        if base == "caps":
            _check_caps(key, value)
        if base == "defaults":
            _check_defaults(key, value)
        if base == "rates":
            _check_rates(key, value)
        out[key] = value
    for key, kind in method.fields.items():
        if key not in out:
            if not kind.endswith("?"):
                raise WireError(key, "is required")
            out[key] = None
    return out


@dataclass(frozen=True, slots=True)
class Muxed:
    """One call of a Multiplex batch. ``method`` None: this call alone is refused with
    ``error`` (its id is good, so the refusal can be addressed to it)."""

    id: int
    method: Method | None
    body: bytes
    error: WireError | None = None


_CALL_KEYS = ("id", "method", "body")


def check_batch(message: Any) -> list[Muxed]:
    """Validate a decoded Multiplex batch ``{v, calls: [{id, method, body}]}``.

    Raises WireError for a batch that cannot be answered call by call (not a map, wrong ``v``,
    no ``calls``, a call without a usable or with a repeated id): the stream then fails and
    nothing of the batch runs. A bad ``method`` or ``body`` refuses only that call.
    """
    if not isinstance(message, dict):
        raise WireError("batch", "must be a msgpack map {v, calls}")
    if message.get("v") != SCHEMA_VERSION:
        got = message.get("v")
        raise WireError("v", f"schema version must be {SCHEMA_VERSION}, got {got!r}")
    for key in message:
        if key not in ("v", "calls"):
            raise WireError(str(key), "unknown field of a Multiplex batch")
    calls = message.get("calls")
    if not isinstance(calls, list) or not calls:
        raise WireError("calls", "must be a non-empty list of {id, method, body} maps")
    if len(calls) > CALLS_PER_BATCH_MAX:
        raise WireError("calls", f"at most {CALLS_PER_BATCH_MAX} calls per batch")
    out: list[Muxed] = []
    seen: set[int] = set()
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            raise WireError(f"calls[{i}]", "must be a map {id, method, body}")
        cid = call.get("id")
        if not isinstance(cid, int) or isinstance(cid, bool) or cid < 0:
            raise WireError(f"calls[{i}].id", f"must be a non-negative int, got {cid!r}")
        if cid in seen:
            raise WireError(f"calls[{i}].id", f"id {cid} appears twice in one batch")
        seen.add(cid)
        out.append(_check_call(i, cid, call))
    return out


def _check_call(i: int, cid: int, call: dict[Any, Any]) -> Muxed:
    name, body = call.get("method"), call.get("body")
    method = METHODS.get(name) if isinstance(name, str) else None
    if len(call) == 3 and method is not None and method.muxable and isinstance(body, bytes):
        return Muxed(cid, method, body)  # the common case, checked at once
    for key in call:
        if key not in _CALL_KEYS:
            return _refused(cid, f"calls[{i}].{key}", "unknown field of a call")
    if method is None:
        return _refused(cid, f"calls[{i}].method", f"unknown method {name!r}")
    if not method.muxable:
        return _refused(
            cid, f"calls[{i}].method", f"{name} cannot travel on Multiplex: call it on its own"
        )
    return _refused(cid, f"calls[{i}].body", "must be bytes: the msgpack request of the method")


def _refused(cid: int, field: str, message: str) -> Muxed:
    return Muxed(cid, None, b"", WireError(field, message))


def pack_batch(key: str, items: list[dict[str, Any]]) -> list[bytes]:
    """``{v, key: items}`` as one message, split into several while one would pass
    MESSAGE_BYTES_MAX or CALLS_PER_BATCH_MAX. A message that is still too large holds a
    single item: the sender decides what to do with it."""
    if len(items) > CALLS_PER_BATCH_MAX:
        return pack_batch(key, items[:CALLS_PER_BATCH_MAX]) + pack_batch(
            key, items[CALLS_PER_BATCH_MAX:]
        )
    data = pack({"v": SCHEMA_VERSION, key: items})
    if len(data) <= MESSAGE_BYTES_MAX or len(items) == 1:
        return [data]
    half = len(items) // 2
    return pack_batch(key, items[:half]) + pack_batch(key, items[half:])

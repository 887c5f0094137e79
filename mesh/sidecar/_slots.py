"""In-flight slots over the sidecar (docs/sidecar.md): acquire hands a client a token,
release takes it back.

A token names one slot the node holds for that client; it is random (a client cannot guess
another's) and bound to the client that took it (the bearer credential when the sidecar
asks for one, else the caller's address), so only that client releases it. Every slot is
taken with a TTL (`ttl_ms`, default SLOT_TTL_MS_DEFAULT): a client that crashes holding
slots frees them when it runs out. A client holds at most TOKENS_PER_CLIENT_MAX tokens and
the sidecar TOKENS_MAX in all; past either, acquire is refused in one line and nothing is
taken.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

from mesh.core.concurrency import SlotVerdict
from mesh.errors import ConfigError
from ratemesh.errors import RatemeshError

__all__ = [
    "SLOT_ROUTES",
    "SLOT_TTL_MS_DEFAULT",
    "SLOT_TTL_MS_MAX",
    "TOKENS_MAX",
    "TOKENS_PER_CLIENT_MAX",
    "SlotKeeper",
    "SlotTokens",
    "client_of",
]

SLOT_ROUTES = ("acquire", "release")
SLOT_TTL_MS_DEFAULT = 30_000
SLOT_TTL_MS_MAX = 3_600_000
TOKENS_PER_CLIENT_MAX = 1024
TOKENS_MAX = 65_536
NAME_MAX_CHARS = 256


class SlotKeeper(Protocol):
    """What the sidecar asks for slots: `mesh.Mesh`."""

    def acquire_slot(
        self, tenant: str, metric: str, *, ttl_ms: int | None = None
    ) -> SlotVerdict: ...

    def release_slot(self, lease: int) -> bool: ...


def client_of(authorization: bytes | None, peer: str) -> str:
    """Who holds a token: a digest of the bearer credential, else the caller's address."""
    if authorization:
        return "bearer:" + hashlib.sha256(authorization).hexdigest()[:16]
    return "peer:" + peer


class SlotTokens:
    """Tokens for slots the node holds on clients' behalf; the named bounds above."""

    def __init__(
        self,
        keeper: SlotKeeper,
        *,
        per_client_max: int = TOKENS_PER_CLIENT_MAX,
        tokens_max: int = TOKENS_MAX,
        clock_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
    ) -> None:
        self.keeper = keeper
        self.per_client_max = per_client_max
        self.tokens_max = tokens_max
        self.clock_ms = clock_ms
        self.tokens: dict[str, tuple[str, int, int]] = {}  # token -> (client, lease, expires)
        self.by_client: dict[str, int] = {}

    def acquire(self, client: str, doc: Any) -> dict[str, Any]:
        """Take a slot for `client` from a request body {tenant, metric, ttl_ms?}: the
        verdict's fields, with `token` when allowed. A bad body or a bound reached is a
        ConfigError naming the field; nothing is taken."""
        tenant, metric, ttl_ms = _acquire_body(doc)
        now = self.clock_ms()
        if (
            self.by_client.get(client, 0) >= self.per_client_max
            or len(self.tokens) >= self.tokens_max
        ):
            self._prune(now)
        if self.by_client.get(client, 0) >= self.per_client_max:
            raise ConfigError(
                "token", f"this client holds {self.per_client_max} slot tokens (the most one may)"
            )
        if len(self.tokens) >= self.tokens_max:
            raise ConfigError(
                "token", f"the sidecar holds {self.tokens_max} slot tokens (its bound)"
            )
        try:
            v = self.keeper.acquire_slot(tenant, metric, ttl_ms=ttl_ms)
        except RatemeshError as exc:
            raise ConfigError("metric", str(exc).split(": ", 1)[-1]) from exc
        out: dict[str, Any] = v.to_dict()
        del out["lease"]  # the node's own number; the client holds the token
        if v.allowed:
            token = secrets.token_urlsafe(18)
            self.tokens[token] = (client, v.lease, now + ttl_ms)
            self.by_client[client] = self.by_client.get(client, 0) + 1
            out["token"] = token
            out["ttl_ms"] = ttl_ms
        return out

    def release(self, client: str, doc: Any) -> bool:
        """Give back the slot a token names; False if it is not this client's or not held
        (released, expired)."""
        if not isinstance(doc, dict) or set(doc) != {"token"} or not isinstance(doc["token"], str):
            raise ConfigError("token", 'the body must be {"token": "<the token acquire gave>"}')
        held = self.tokens.get(doc["token"])
        if held is None or held[0] != client:
            return False
        self._drop(doc["token"])
        return self.keeper.release_slot(held[1])

    def _drop(self, token: str) -> None:
        client = self.tokens.pop(token)[0]
        left = self.by_client[client] - 1
        if left:
            self.by_client[client] = left
        else:
            del self.by_client[client]

    def _prune(self, now_ms: int) -> None:
        """Forget tokens whose TTL ran out (the node released their slots already)."""
        for token in [t for t, (_, _, exp) in self.tokens.items() if exp <= now_ms]:
            self._drop(token)


def _acquire_body(doc: Any) -> tuple[str, str, int]:
    if not isinstance(doc, dict):
        raise ConfigError("body", 'must be {"tenant": ..., "metric": ..., "ttl_ms": ...}')
    unknown = sorted(set(map(str, doc)) - {"tenant", "metric", "ttl_ms"})
    if unknown:
        raise ConfigError(unknown[0], "unknown key")
    for name in ("tenant", "metric"):
        value = doc.get(name)
        if not isinstance(value, str) or not 0 < len(value) <= NAME_MAX_CHARS:
            raise ConfigError(name, f"must be a string of 1 to {NAME_MAX_CHARS} characters")
    ttl = doc.get("ttl_ms", SLOT_TTL_MS_DEFAULT)
    if type(ttl) is not int or not 1 <= ttl <= SLOT_TTL_MS_MAX:
        raise ConfigError("ttl_ms", f"must be an integer from 1 to {SLOT_TTL_MS_MAX}")
    return doc["tenant"], doc["metric"], ttl

"""Who a call is from: a session token, or a tenant's API key (with the key's own session).

A token's session that has ended is remembered for a while (by token hash), so a late call
learns why it is refused, and a late Release learns how its lease ended.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

import grpc

from governor import wire
from governor.authority import Authority
from governor.engine import Engine, Event, SessionState
from governor.engine import _events as ev

from ._calls import Principal, Steps
from ._multiplex import Metadata
from ._status import Fail, sha256_hex

__all__ = ["DERIVED_TOKEN_PREFIX", "ENDED_TOKENS_MAX", "KEY_SESSION_TTL_MS", "Auth"]

KEY_SESSION_TTL_MS = 10 * 365 * 24 * 3600 * 1000  # a bare API key's session: hooks, no leases
# Releases before random key sessions gave a bare key's session the token
# DERIVED_TOKEN_PREFIX + sha256(key), computable from governord.yaml. Such a token is refused
# before any lookup, and a key's old session is closed the first time the key is used.
DERIVED_TOKEN_PREFIX = "governord-key-session:"
ENDED_TOKENS_MAX = 65_536


class Auth:
    """Turns a call's metadata into a ``Principal``, or refuses it with a Fail."""

    def __init__(
        self,
        authority: Authority,
        steps: Steps,
        tenants: dict[str, tuple[str, int]],  # key sha256 -> (tenant name, scope node id)
    ) -> None:
        self._authority = authority
        self._steps = steps
        self.tenants = tenants
        self._ended_tokens: OrderedDict[str, int] = OrderedDict()
        self._key_sessions: dict[str, int] = {}
        authority.event_listeners.append(self._on_event)

    def _on_event(self, event: Event) -> None:
        """Under the lock: remember ended sessions' token hashes (a late call learns why)."""
        if isinstance(event, (ev.SessionClosed, ev.SessionExpired)):
            session = self._authority.engine.state.sessions.get(event.session_id)
            if session is not None:
                self._ended_tokens[session.token_sha256] = event.session_id
                while len(self._ended_tokens) > ENDED_TOKENS_MAX:
                    self._ended_tokens.popitem(last=False)

    async def authenticate(self, method: wire.Method, md: Metadata) -> Principal | None:
        token, key = md.get(wire.TOKEN_MD), md.get(wire.KEY_MD)
        if isinstance(token, bytes) or isinstance(key, bytes):
            raise Fail(grpc.StatusCode.UNAUTHENTICATED, "credentials", "credentials must be text")
        if token is not None and method.auth in ("token", "key_or_token"):
            return self.by_token(token, late_release=method.name == "Release")
        if key is not None and method.auth in ("key", "key_or_token"):
            digest = sha256_hex(key)
            tenant = self.tenants.get(digest)
            if tenant is None:
                raise Fail(grpc.StatusCode.UNAUTHENTICATED, "bad_key", "unknown API key")
            if method.auth == "key" and method.name == "OpenSession":
                return Principal(0, tenant[1], tenant[0], True)
            return await self._key_session(digest, tenant)
        if key is not None:
            raise Fail(
                grpc.StatusCode.PERMISSION_DENIED,
                "needs_session",
                f"{method.name} needs a session token; a bare API key may call EnsureNode and "
                "Consume",
            )
        raise Fail(
            grpc.StatusCode.UNAUTHENTICATED,
            "no_credentials",
            f"{method.name} needs a {'session token' if method.auth == 'token' else 'API key'}",
        )

    def by_token(self, token: str, *, late_release: bool = False) -> Principal:
        """The open session of ``token`` (with ``late_release``, also one lately ended)."""
        if token.startswith(DERIVED_TOKEN_PREFIX):
            raise Fail(
                grpc.StatusCode.UNAUTHENTICATED,
                "derived_token",
                "a token derived from an API key is not a credential: call with the key, or "
                "with the token OpenSession returned",
            )
        digest = sha256_hex(token)
        engine = self._authority.engine
        sid = engine.session_for_token(digest)
        if sid is None:
            if late_release and digest in self._ended_tokens:
                # a late release learns how its lease ended (FAILED_PRECONDITION lease_ended)
                ended = engine.state.sessions.get(self._ended_tokens[digest])
                if ended is not None:
                    return Principal(ended.id, ended.scope_id, "", False)
            if digest in self._ended_tokens:
                raise Fail(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "session_ended",
                    f"session {self._ended_tokens[digest]} has ended (expired or closed)",
                    session_id=self._ended_tokens[digest],
                )
            raise Fail(grpc.StatusCode.UNAUTHENTICATED, "bad_token", "unknown or ended token")
        session = engine.state.sessions[sid]
        return Principal(sid, session.scope_id, "", False)

    async def _key_session(self, digest: str, tenant: tuple[str, int]) -> Principal:
        """The bare key's own session: found by the key's digest, opened with a random token
        that is never handed out (only the key reaches it, and nothing in the config computes
        it). Reopened if it ever ended, so no other caller can lock the key out."""
        sid = self._key_sessions.get(digest)
        session = None if sid is None else self._authority.engine.state.sessions.get(sid)
        if sid is None or session is None or session.state is not SessionState.OPEN:
            legacy = sha256_hex(DERIVED_TOKEN_PREFIX + digest)

            def ensure(e: Engine) -> int:
                old = e.session_for_token(legacy)  # an older release's, reachable by then
                if old is not None:
                    e.close_session(old)
                found = e.session_for_key(digest)
                if found is not None:
                    return found
                token_hash = sha256_hex(secrets.token_urlsafe(32))  # no one is given it
                ttl = KEY_SESSION_TTL_MS
                return e.open_session(tenant[1], ttl, token_hash, key_sha256=digest)[0]

            sid = await self._steps.step(ensure)  # once per key per process
            assert sid is not None
            self._key_sessions[digest] = sid
        return Principal(sid, tenant[1], tenant[0], True)

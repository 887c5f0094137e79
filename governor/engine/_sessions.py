"""Sessions: opened on a scope node with a TTL, kept alive by heartbeats, closed or expired.

A session ends with its leases and its waits (the lease book's ``end_session``); expiry is the
housekeeping's, closing is the caller's.
"""

from __future__ import annotations

from . import _events as ev
from ._core import Core, _ident, _int
from ._errors import InvalidArgument, NotFound
from ._housekeeping import Housekeeping
from ._leasebook import LeaseBook
from ._types import SessionState

__all__ = ["Sessions"]


class Sessions:
    """The session calls and the lookups by token and by key."""

    def __init__(self, core: Core, clock: Housekeeping, leases: LeaseBook) -> None:
        self._core = core
        self._clock = clock
        self._leases = leases

    def open_session(
        self, scope_id: int, ttl_ms: int, token_sha256: str, *, key_sha256: str | None = None
    ) -> tuple[int, int]:
        """Open a session confined to ``scope_id``'s subtree; returns (session_id, expires_ms).

        ``key_sha256`` marks a bare API key's session, found again by ``session_for_key``: the
        driver gives it a random token it never hands out, so only the key reaches it."""
        now = self._clock.advance()
        core = self._core
        _int("ttl_ms", ttl_ms, 1)
        for field, digest in (("token_sha256", token_sha256), ("key_sha256", key_sha256)):
            if digest is None and field == "key_sha256":
                continue
            if not isinstance(digest, str) or len(digest) != 64:
                raise InvalidArgument(field, "must be 64 hex characters")
        if key_sha256 is not None and key_sha256 in core.state.by_key:
            raise InvalidArgument("key_sha256", "the key has an open session")
        if _ident("scope_id", scope_id) not in core.state.nodes:
            raise NotFound("scope_id", f"no node {scope_id}")
        sid = core.state.next_id
        core.emit(
            ev.SessionOpened(core.seq(), now, sid, scope_id, ttl_ms, token_sha256, key_sha256)
        )
        return sid, now + ttl_ms

    def heartbeat(self, session_id: int) -> int:
        """Renew the session's TTL (not recorded); returns the new expiry."""
        now = self._clock.advance()
        session = self._core.session(session_id)
        session.expires_ms = now + session.ttl_ms
        self._core.timers.add_expiry(session.expires_ms, session.id)
        return session.expires_ms

    def close_session(self, session_id: int) -> None:
        now = self._clock.advance()
        session = self._core.session(session_id)
        self._leases.end_session(session, SessionState.CLOSED, now)
        self._leases.dispatch()

    def session_for_token(self, token_sha256: str) -> int | None:
        """The open session a token's SHA-256 belongs to (the driver hashes what a caller sends)."""
        return self._core.state.by_token.get(token_sha256)

    def session_for_key(self, key_sha256: str) -> int | None:
        """The open session of a bare API key (by the key's SHA-256), if it has one."""
        return self._core.state.by_key.get(key_sha256)

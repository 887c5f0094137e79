"""What every group of the service's calls shares: who is calling, and ``Steps``, one engine step
and the wait for its commit. The groups are ``_sessioncalls`` (sessions and leases),
``_nodecalls`` (the tree, its edits and its watch) and ``_creditcalls`` (credit blocks and
rates); ``_auth`` says who a call is from, and ``_service`` runs them (in-flight idempotency,
status mapping, metrics)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from governor.authority import Authority
from governor.engine import Edited, Engine

from ._commit import CommitWaits

__all__ = ["Impl", "Principal", "Steps"]


@dataclass(frozen=True, slots=True)
class Principal:
    session_id: int
    scope_id: int
    tenant: str
    by_key: bool


# one call: (caller, checked body) -> reply; a GovernorError or Fail raised is the error reply
Impl = Callable[[Principal | None, dict[str, Any]], Awaitable[dict[str, Any]]]


class Steps:
    """Engine steps for the calls: nothing replies before the record holds everything its
    answer depends on. ``changed`` is set (and replaced) after every step that may have
    granted a queued acquire."""

    def __init__(
        self, authority: Authority, commits: CommitWaits, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.authority = authority
        self.commits = commits
        self._loop = loop
        self.changed = asyncio.Event()
        authority.change_listeners.append(self._notify_changed)

    def _notify_changed(self) -> None:
        self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    async def step(self, fn: Callable[[Engine], Any]) -> Any:
        """Run ``fn`` as one engine step; return (or raise) its outcome once it may be sent."""
        result, error, seq, wrote = self.authority.step(fn)
        await self.commits.reply_ready(seq, wrote)
        if error is not None:
            raise error
        return result

    async def edit(self, fn: Callable[[Engine], Any]) -> dict[str, Any]:
        """An edit's step, and its reply: the node it changed."""
        r = await self.step(fn)
        assert isinstance(r, Edited)
        return {"node_id": r.node_id}

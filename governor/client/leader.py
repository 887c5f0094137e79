"""Following the leader among the governords that share one record (a leader and its
standbys): which address a call goes to, where it goes after an UNAVAILABLE, how long it
waits before the next try, and when it gives up.

Every client of governord follows the leader this one way: the SDK's calls
(``governor.client``) and the mesh's coordinator client (``mesh.peer.CoordinatorClient``,
behind ``mesh policy ...`` and a node's policy feed). A standby, or a deposed leader, answers
UNAVAILABLE with governord's detail map ``{reason: not_leader, leader: <addr>}`` in the
trailing metadata (``wire.ERROR_MD``, decoded by ``status_of``). The follower goes straight
to that leader (learning its address when it was not given one: a caller pointed at a
standby alone still reaches the leader), else to the next address, and resends with
a jittered exponential back-off until the caller's deadline: an election is ridden out, a
refusal (any other status, governord's own answer) is not.

The transport stays with the caller: an attempt is a coroutine ``attempt(at, timeout_s)``
that calls address ``addrs[at]`` and raises ``CallFailed`` for an error status."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from governor import wire
from ratemesh.checks import check_address
from ratemesh.errors import ConfigError

from ._errors import LeaderChanged
from ._mux import CallFailed, status_of

__all__ = [
    "ADDRS_LEARNED_MAX",
    "ATTEMPT_TIMEOUT_S",
    "BACKOFF_MAX_S",
    "BACKOFF_MIN_S",
    "ELECTION_BACKOFF_MAX_S",
    "NOT_LEADER",
    "CallFailed",
    "LeaderFollower",
    "status_of",
]

NOT_LEADER = wire.NOT_LEADER  # a standby's (or deposed leader's) reason; ``leader``: the hint
# What is resent (same bytes, same request id): governord could not be reached, or is not
# the leader. Anything else is an answer, and goes back to the caller.
RESEND = frozenset({grpc.StatusCode.UNAVAILABLE})
BACKOFF_MIN_S = 0.02
BACKOFF_MAX_S = 0.5
# With several addresses an election is short: keep looking for the new leader.
ELECTION_BACKOFF_MAX_S = 0.1
# With several addresses, one attempt of a call that does not wait gives up after this long
# and goes to the next address (same bytes, same request id): a leader that is paused or cut
# off keeps its connections open, so only a deadline moves the caller on.
ATTEMPT_TIMEOUT_S = 0.75
# Leaders named by a standby beyond the addresses given (a client pointed at a standby
# alone): a bound, so a misbehaving standby cannot grow the list without end.
ADDRS_LEARNED_MAX = 8

T = TypeVar("T")


class LeaderFollower:
    """The addresses of one record and which of them leads, as far as this client knows.

    ``current`` is the index calls go to; ``answered`` the one that answered last (the leader,
    None after it failed); ``switches`` counts moves to another address (diagnostics, tests).
    Shared by every call of one client, so one call's move is every call's."""

    def __init__(self, addrs: tuple[str, ...]) -> None:
        if not addrs:
            raise ValueError("a leader follower needs at least one address")
        self.addrs = addrs  # grows by the leaders standbys name (`learn`)
        self.given = len(addrs)
        self.current = 0
        self.answered: int | None = None
        self.switches = 0

    @property
    def leader(self) -> str:
        """The address calls go to now: the one that answered last, or the next to try."""
        return self.addrs[self.current]

    def learn(self, hint: str) -> bool:
        """Add a leader a standby named that the caller was not given (`mesh policy list
        --coordinator <standby>` follows it rather than failing), if it is a host:port and
        fewer than ADDRS_LEARNED_MAX were learned; True if added. Trusted as far as the
        standby is: the same TLS and key go to it."""
        if len(self.addrs) - self.given >= ADDRS_LEARNED_MAX:
            return False
        try:
            check_address("leader", hint)
        except ConfigError:
            return False
        self.addrs = (*self.addrs, hint)
        return True

    @property
    def several(self) -> bool:
        return len(self.addrs) > 1

    def attempt_timeout(self, timeout_s: float | None, *, waits: bool = False) -> float | None:
        """One attempt's timeout for a call with ``timeout_s``: capped at ATTEMPT_TIMEOUT_S
        with several addresses, unless the call waits in the leader's memory (``waits``)."""
        if self.several and not waits:
            return min(timeout_s or ATTEMPT_TIMEOUT_S, ATTEMPT_TIMEOUT_S)
        return timeout_s

    def moved(self, at: int, failed: CallFailed) -> bool:
        """Address ``at`` was unavailable: go to the leader it named if that is one of ours,
        else to the next address. True when the call may go again at once: it was redirected
        (not a guess), or another call had already moved on from ``at``."""
        if self.answered == at:
            self.answered = None
        if self.current != at:
            return True
        hint = failed.detail.get("leader") if failed.detail.get("reason") == NOT_LEADER else None
        if isinstance(hint, str) and hint not in self.addrs:
            self.learn(hint)
        named = isinstance(hint, str) and hint in self.addrs and hint != self.addrs[at]
        if named:
            self.current = self.addrs.index(hint)  # type: ignore[arg-type]  # named: a str
        else:
            self.current = (at + 1) % len(self.addrs)
        if self.current != at:
            self.switches += 1
        return named

    async def call(
        self,
        attempt: Callable[[int, float | None], Awaitable[T]],
        *,
        give_up_at: float | None,
        timeout_s: float | None = None,
        waits: bool = False,
    ) -> T:
        """``attempt(at, timeout)`` at the leader until one answers; resent while governord is
        unavailable, following the leader, until ``give_up_at`` (monotonic seconds; None:
        without end). Raises the last ``CallFailed`` for a refusal or at the deadline.

        ``waits``: the call waits in the leader's memory (its fair queue); one cut by a leader
        change is not resent behind the caller's back: LeaderChanged. Cut means UNAVAILABLE
        from the address that had answered last, when it says it is not the leader or when
        there is another address to take over (with one address, a restart of that governord
        is resent as any call is)."""
        attempt_s = self.attempt_timeout(timeout_s, waits=waits)
        timed = attempt_s is not None and attempt_s != timeout_s
        backoff = BACKOFF_MIN_S
        cap = ELECTION_BACKOFF_MAX_S if self.several else BACKOFF_MAX_S
        redirected = False
        while True:
            at = self.current
            was_leader = self.answered == at
            try:
                reply = await attempt(at, attempt_s)
            except CallFailed as failed:
                if timed and failed.code is grpc.StatusCode.DEADLINE_EXCEEDED and not failed.detail:
                    # this attempt's own deadline: that address may be paused or cut off
                    failed = CallFailed(grpc.StatusCode.UNAVAILABLE, failed.details, {})
                if failed.code not in RESEND:
                    if failed.detail:  # governord's own answer: this is the leader
                        self.answered = at
                    raise failed from None
                not_leader = failed.detail.get("reason") == NOT_LEADER
                hinted = self.moved(at, failed) if self.several or not_leader else False
                if waits and was_leader and (not_leader or self.several):
                    raise leader_changed(self.addrs[at], failed) from None
                now = time.monotonic()
                if give_up_at is not None and now >= give_up_at:
                    raise failed from None
                if hinted and not redirected:
                    redirected = True  # follow a redirect at once; a second one backs off
                    continue
                redirected = False
                pause = random.uniform(backoff / 2, backoff)  # jitter: callers do not march
                if give_up_at is not None:
                    pause = min(pause, give_up_at - now)
                await asyncio.sleep(pause)
                backoff = min(cap, backoff * 2)
            else:
                self.answered = at
                return reply


def leader_changed(addr: str, failed: CallFailed) -> LeaderChanged:
    """The error of a waiting call cut by a leader change at ``addr``."""
    message = (
        f"the leader changed while the acquire waited; retry ({addr}: "
        f"{failed.code.name}: {failed.details})"
    )
    return LeaderChanged(message, failed.code.name, failed.detail)

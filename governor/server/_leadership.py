"""Becoming the leader on a shared PostgreSQL database: tail the record, take the row when free.

A governord on PostgreSQL starts as a candidate (docs/failover.md). Every ``renew_ms`` it reads
the leader row and the events committed since its last look (so a takeover replays only the
tail), and takes the row when nobody holds it, when the holder's backend is gone (its process
died: a takeover within about ``renew_ms``), or when the holder has not renewed for its lease (it
is cut off from the database). Once it holds the new epoch it reads the rest of the record, so
nothing the old leader committed is missed: the old leader's commits renew the row in their own
transaction, so none can land after the epoch changed. The record then goes through the same
replay as a restart (``Authority(loaded=...)``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from dataclasses import dataclass

from governor.config import HaSettings
from governor.store import EventLog, LeaderRow, Leadership, Loaded

__all__ = ["Candidate", "Elected", "holder_id"]

# A process that finds the row held by a backend that is already gone (the process it replaces
# was killed a moment ago) tries this many more rounds before it says "standby".
FIRST_TRIES = 3


def holder_id() -> str:
    """Who this process is in the leader row: host, pid and a random tag (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class Elected:
    epoch: int
    loaded: Loaded
    replaced: LeaderRow | None  # the row this process took over (None: the first leader)


class Candidate:
    def __init__(
        self, log: EventLog, backend: Leadership, ha: HaSettings, address: str, holder: str
    ) -> None:
        self._log = log
        self._backend = backend
        self._ha = ha
        self.address = address
        self.holder = holder
        self.seen: LeaderRow | None = None  # the leader row at the last look
        self.loaded: Loaded | None = None  # the record as tailed so far
        self.looks = 0
        self.tail = True  # False only in a planted-bug test (``_plant``, serve_before_replay)

    def leader(self) -> tuple[str, int]:
        """(address, epoch) of whoever leads, as last seen: what a standby tells clients. A
        leader that has missed two renewals is not named (it may be paused or cut off): the
        client then tries another address instead of going back to it."""
        row = self.seen
        if row is None or row.takeable or row.renewed_age_ms > 2 * self._ha.renew_ms:
            return "", row.epoch if row else 0
        return row.address, row.epoch

    def look(self) -> Elected | None:
        """One round (blocking: run it in a thread): read the row, take it if it may be taken,
        and tail the record either way."""
        self.looks += 1
        row = self._backend.leader()
        self.seen = row
        epoch = None
        if row is None or row.takeable:
            epoch = self._backend.try_lead(self.holder, self.address, self._ha.lease_ms)
        if self.tail or self.loaded is None:
            self.loaded = self._log.load(self.loaded)
        if epoch is None:
            return None
        return Elected(epoch, self.loaded, row)

    async def campaign(self, stop: asyncio.Event, *, first: bool = False) -> Elected | None:
        """Look every ``renew_ms`` until this process leads (or ``stop``); ``first``: give up
        after a few looks, so a fresh process can say it is a standby."""
        tries = 0
        while not stop.is_set():
            elected = await asyncio.to_thread(self.look)
            if elected is not None:
                return elected
            tries += 1
            if first and tries >= FIRST_TRIES:
                return None
            try:
                await asyncio.wait_for(stop.wait(), self._ha.renew_ms / 1000)
            except TimeoutError:
                pass
        return None

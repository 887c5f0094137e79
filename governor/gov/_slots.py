"""Taking a slot the way `gov run` and `slot()` do: wait out any cooldown, claim, and fail
open once the priority's wait window is spent.

The wait is a sequence of attempts (`Attempt.step`), so the blocking form (`acquire_slot`)
and the asyncio form (`governor.client.slot`) are one policy with two ways of sleeping.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ratemesh.checks import check_choice, check_float, check_int

from ._cooldown import Cooldown
from ._paths import GovDir, check_name, gov_dir, write_atomic, write_new
from ._semaphore import SLOTS_MAX, Claim, Holder, LocalSemaphore

__all__ = [
    "PRIORITIES",
    "TTL_DEFAULT_S",
    "Acquired",
    "Attempt",
    "acquire_slot",
    "release_slot",
    "window_s",
]

# Seed 003's priority-aware windows: realtime work waits a few seconds and fails open for
# latency; standard and batch work wait longer rather than burst.
PRIORITIES: dict[str, float] = {"high": 5.0, "normal": 120.0, "low": 600.0}
TTL_DEFAULT_S = 3600.0  # a slot whose holder stopped heartbeating is reaped after this
POLL_MIN_S = 0.01
POLL_MAX_S = 0.25


def window_s(priority: str, wait_s: float | None) -> float:
    check_choice("priority", priority, PRIORITIES)
    if wait_s is None:
        return PRIORITIES[priority]
    return check_float("wait_s", wait_s, minimum=0.0, maximum=86_400.0)


@dataclass
class Acquired:
    """What a caller got: a claim, or None when it fails open (`fail_open` says why)."""

    name: str
    claim: Claim | None
    waited_s: float
    fail_open: str | None = None
    cooled_s: float = 0.0  # of the wait, how long was spent waiting out a cooldown
    lease: bool = False  # held as a governord lease (fleet-wide), not a local slot

    @property
    def held(self) -> bool:
        return self.claim is not None or self.lease


class Attempt:
    """One caller's wait for a slot; `step()` returns (result or None, seconds to sleep)."""

    def __init__(
        self,
        name: str,
        max_slots: int,
        *,
        priority: str = "normal",
        wait_s: float | None = None,
        command: str = "",
        ttl_s: float = TTL_DEFAULT_S,
        root: GovDir | None = None,
    ) -> None:
        self.name = check_name(name)
        self.max = check_int("max", max_slots, minimum=1, maximum=SLOTS_MAX)
        self.window = window_s(priority, wait_s)
        self.ttl_s = check_float("ttl_s", ttl_s, minimum=1.0, maximum=7 * 86_400.0)
        self.root = root or gov_dir()
        self.sem = LocalSemaphore(self.root, self.name)
        self.cooldown = Cooldown(self.root)
        self.holder = Holder.here(command, self.ttl_s, priority)
        write_atomic(self.sem.dir / "max.json", {"max": self.max}, self.root.tmp())
        self.started = time.monotonic()
        self.cooled_s = 0.0
        self._poll = POLL_MIN_S
        self._waiting: os.PathLike[str] | None = None

    def step(self) -> tuple[Acquired | None, float]:
        waited = time.monotonic() - self.started
        left = self.window - waited
        cool = self.cooldown.remaining_s(self.name)
        if cool > 0:
            if left <= 0:
                return self._done(None, waited, f"cooldown {cool:.1f}s left after the window"), 0
            self._wait_here()
            pause = min(cool, left, 1.0)
            self.cooled_s += pause
            return None, pause
        claim = self.sem.try_claim(self.max, self.holder)
        if claim is not None:
            return self._done(claim, waited, None), 0
        if left <= 0:
            return self._done(None, waited, f"no slot free (max {self.max})"), 0
        self._wait_here()
        pause, self._poll = min(self._poll, left), min(self._poll * 2, POLL_MAX_S)
        return None, pause

    def cooling(self) -> tuple[Acquired | None, float]:
        """The cooldown part of `step` alone (a governord lease is taken after it): (a
        fail-open once the window is spent, or None; seconds to sleep, 0 when it is over)."""
        left = self.window - (time.monotonic() - self.started)
        cool = self.cooldown.remaining_s(self.name)
        if cool <= 0:
            return None, 0.0
        if left <= 0:
            return self.step()[0], 0.0
        self._wait_here()
        pause = min(cool, left, 1.0)
        self.cooled_s += pause
        return None, pause

    def left_s(self) -> float:
        return max(0.0, self.window - (time.monotonic() - self.started))

    def done(self, got: Acquired) -> Acquired:
        """Finish with an outcome decided elsewhere (a lease, or its refusal: fail open)."""
        got.cooled_s = self.cooled_s
        self._unwait()
        if got.fail_open is not None:
            fail_open(self.root, got, self.holder)
        return got

    def cancel(self) -> None:
        self._unwait()

    def wait(self, sleep: Callable[[float], object] = time.sleep) -> Acquired:
        """`step` until there is an outcome, sleeping between steps (the blocking form)."""
        try:
            while True:
                got, pause = self.step()
                if got is not None:
                    return got
                sleep(pause)
        finally:
            self.cancel()

    def _done(self, claim: Claim | None, waited: float, reason: str | None) -> Acquired:
        self._unwait()
        got = Acquired(self.name, claim, waited, reason, self.cooled_s)
        if reason is not None:
            fail_open(self.root, got, self.holder)
        return got

    def _wait_here(self) -> None:
        if self._waiting is None:
            path = self.root.waiters(self.name) / self.holder.token
            write_new(path, _json(asdict(self.holder)))
            self._waiting = path

    def _unwait(self) -> None:
        if self._waiting is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._waiting)
            self._waiting = None


def acquire_slot(
    name: str,
    max_slots: int,
    *,
    priority: str = "normal",
    wait_s: float | None = None,
    command: str = "",
    ttl_s: float = TTL_DEFAULT_S,
    root: GovDir | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Acquired:
    """Block until a slot is ours or the window is spent (then fail open, logged)."""
    attempt = Attempt(
        name, max_slots, priority=priority, wait_s=wait_s, command=command, ttl_s=ttl_s, root=root
    )
    return attempt.wait(sleep)


def release_slot(root: GovDir, got: Acquired) -> None:
    if got.claim is not None:
        LocalSemaphore(root, got.name).release(got.claim)


def fail_open(root: GovDir, got: Acquired, holder: Holder) -> None:
    """Say, on stderr and in gov.log, that this caller runs without a slot and why."""
    line = (
        f"gov: fail-open: running {holder.command or 'the block'!r} without a "
        f"{got.name!r} slot after {got.waited_s:.1f}s: {got.fail_open}"
    )
    print(line, file=sys.stderr, flush=True)
    root.log(
        {
            "event": "fail_open",
            "name": got.name,
            "reason": got.fail_open,
            "waited_s": round(got.waited_s, 3),
            "pid": holder.pid,
            "command": holder.command,
            "priority": holder.priority,
            "time": time.time(),
        }
    )


def _json(data: object) -> str:
    return json.dumps(data, sort_keys=True)

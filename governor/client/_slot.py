"""`with slot("name", max=2):` and `async with slot(...)`: `gov run` for a block of Python.

The same slots, windows, cooldown and fail-open as the `gov` command (governor.gov): a
block waits out a cooldown and a full set of slots for its priority's window, then runs
anyway and says so (stderr and `$GOV_DIR/gov.log`). With `GOVERNOR_ADDR` set the slot is a
governord lease, so `max` holds across machines (`LeaseSlot`); when governord does not
answer, the machine-local semaphore stands in, disclosed. `Slot.saw_429()` (or
`cooldown()`) trips the machine's cooldown from Python, as a 429 in a command's output does
for `gov run`.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

from governor.gov import COOLDOWN_DEFAULT_S, Acquired, Cooldown, FailOpen, GovDir, gov_dir
from governor.gov._slots import TTL_DEFAULT_S, Attempt, release_slot
from ratemesh.errors import ConfigError

from ._leaseslot import LeaseSlot, fleet_cooldown, governord_addr

__all__ = ["Slot", "slot", "cooldown", "take_slot"]


def take_slot(
    attempt: Attempt,
    remote: LeaseSlot | None,
    sleep: Callable[[float], object] = time.sleep,
) -> Acquired:
    """The whole wait: the cooldown, then a governord lease (when configured and answering)
    or a local slot, then fail open once the window is spent."""
    try:
        if remote is not None and fleet_cooldown():
            if remote.mirror_cooldowns(attempt.cooldown) is not None:
                _disclose_fallback(attempt, "governord unreachable")
                remote = None
        if remote is not None:
            while True:
                got, pause = attempt.cooling()
                if got is not None:
                    return got
                if pause <= 0:
                    break
                sleep(pause)
            waited = attempt.window - attempt.left_s()
            reason = remote.take(attempt.left_s())
            if reason is None:
                return attempt.done(Acquired(attempt.name, None, waited, lease=True))
            if not remote.unreachable:
                return attempt.done(Acquired(attempt.name, None, waited, reason))
            _disclose_fallback(attempt, reason)
        return attempt.wait(sleep)
    finally:
        attempt.cancel()


def _disclose_fallback(attempt: Attempt, reason: str) -> None:
    print(
        f"gov: {reason}: using this machine's {attempt.name!r} slots (max {attempt.max} on "
        "this machine only, not across the fleet)",
        file=sys.stderr,
        flush=True,
    )
    attempt.root.log(
        {
            "event": "governord_fallback",
            "name": attempt.name,
            "reason": reason,
            "pid": attempt.holder.pid,
            "command": attempt.holder.command,
            "time": time.time(),
        }
    )


def publish(remote: LeaseSlot | None, seconds: float, name_only: bool) -> None:
    """Send a tripped cooldown to every machine through governord when that is switched on
    (GOV_FLEET_COOLDOWN=1); fail-open and said on stderr when governord does not take it."""
    if remote is None or not fleet_cooldown():
        return
    failed = remote.publish_cooldown(seconds, name_only)
    where = "every machine" if failed is None else "this machine only"
    note = "" if failed is None else f": {failed}"
    print(f"gov: cooldown of {seconds:g}s for {where}{note}", file=sys.stderr, flush=True)


class Slot:
    """One use of a slot: a context manager, sync or async (not both at once)."""

    def __init__(
        self,
        name: str = "default",
        *,
        max: int = 2,  # noqa: A002 - the word the seed and `gov run --max` use
        priority: str = "normal",
        wait_s: float | None = None,
        ttl_s: float = TTL_DEFAULT_S,
        root: GovDir | None = None,
        governord: bool | None = None,
    ) -> None:
        self.root = root or gov_dir()
        # Why this block runs without a slot whatever happens (seed 003's fail-open when
        # nothing can be reached): the machine's state directory cannot be used.
        self.broken: str | None = None
        self._attempt: Attempt | None = None
        try:
            self._attempt = Attempt(
                name,
                max,
                priority=priority,
                wait_s=wait_s,
                command=f"python slot({name!r})",
                ttl_s=ttl_s,
                root=self.root,
            )
        except (OSError, ConfigError) as exc:
            if isinstance(exc, ConfigError) and exc.field != "GOV_DIR":
                raise  # the caller's argument, not an outage
            self.broken = f"no usable state directory ({type(exc).__name__}: {exc})"
        self.name = name if self._attempt is None else self._attempt.name
        use_remote = governord_addr() is not None if governord is None else governord
        self.remote = (
            LeaseSlot(self.name, self._attempt.max)
            if use_remote and self._attempt is not None
            else None
        )
        self.got: Acquired | None = None
        self._stop = threading.Event()

    @property
    def held(self) -> bool:
        """True if the block holds a slot (local or a governord lease); False if it failed
        open."""
        return self.got is not None and self.got.held

    def saw_429(self, seconds: float = COOLDOWN_DEFAULT_S, *, name_only: bool = False) -> None:
        """The work in this block was told 429: back the machine (or this name) off."""
        Cooldown(self.root).trip(
            seconds, self.name if name_only else None, f"429 reported by slot({self.name!r})"
        )
        publish(self.remote, seconds, name_only)

    def _fail_open(self) -> bool:
        """Run without a slot when nothing can be reached (`broken`), said in one line."""
        if self.broken is None:
            return False
        FailOpen(self.name, self.broken).__enter__()
        self.got = Acquired(self.name, None, 0.0, self.broken)
        return True

    def __enter__(self) -> Slot:
        if not self._fail_open():
            assert self._attempt is not None
            self._started(take_slot(self._attempt, self.remote, self._stop.wait))
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release()

    async def __aenter__(self) -> Slot:
        if self._fail_open():
            return self
        assert self._attempt is not None
        if self.remote is not None:  # the SDK's sync client blocks: wait off the loop
            got = await asyncio.to_thread(take_slot, self._attempt, self.remote)
        else:
            try:
                while True:
                    done, pause = self._attempt.step()
                    if done is not None:
                        got = done
                        break
                    await asyncio.sleep(pause)
            finally:
                self._attempt.cancel()
        self._started(got)
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.remote is not None:
            await asyncio.to_thread(self._release)
        else:
            self._release()

    def _started(self, got: Acquired) -> None:
        self.got = got
        if got.claim is not None and self._attempt is not None:
            claim, sem = got.claim, self._attempt.sem
            period = max(0.5, claim.holder.ttl_s / 3)

            def beat() -> None:
                while not self._stop.wait(period):
                    if not sem.heartbeat(claim):
                        return

            threading.Thread(target=beat, daemon=True, name=f"slot-{self.name}").start()

    def _release(self) -> None:
        self._stop.set()
        if self.got is not None:
            release_slot(self.root, self.got)
        if self.remote is not None:
            self.remote.give_back()


def slot(
    name: str = "default",
    *,
    max: int = 2,  # noqa: A002
    priority: str = "normal",
    wait_s: float | None = None,
    ttl_s: float = TTL_DEFAULT_S,
) -> Slot:
    """A slot of `name` for one block: `with slot(...):` or `async with slot(...):`."""
    return Slot(name, max=max, priority=priority, wait_s=wait_s, ttl_s=ttl_s)


def cooldown(seconds: float = COOLDOWN_DEFAULT_S, name: str | None = None) -> None:
    """Trip the machine's (or `name`'s) cooldown for at least `seconds`."""
    Cooldown(gov_dir()).trip(seconds, name, "cooldown() called")

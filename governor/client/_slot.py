"""`with slot("name", max=2):` and `async with slot(...)`: `gov run` for a block of Python.

The same slots, windows, cooldown and fail-open as the `gov` command (governor.gov): a
block waits out a cooldown and a full set of slots for its priority's window, then runs
anyway and says so (stderr and `$GOV_DIR/gov.log`). `Slot.saw_429()` (or `cooldown()`)
trips the machine's cooldown from Python, as a 429 in a command's output does for `gov run`.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

from governor.gov import COOLDOWN_DEFAULT_S, Acquired, Cooldown, GovDir, gov_dir
from governor.gov._slots import TTL_DEFAULT_S, Attempt, release_slot

__all__ = ["Slot", "slot", "cooldown"]


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
    ) -> None:
        self.root = root or gov_dir()
        self._attempt = Attempt(
            name,
            max,
            priority=priority,
            wait_s=wait_s,
            command=f"python slot({name!r})",
            ttl_s=ttl_s,
            root=self.root,
        )
        self.name = self._attempt.name
        self.got: Acquired | None = None
        self._stop = threading.Event()

    @property
    def held(self) -> bool:
        """True if the block holds a slot; False if it failed open."""
        return self.got is not None and self.got.claim is not None

    def saw_429(self, seconds: float = COOLDOWN_DEFAULT_S, *, name_only: bool = False) -> None:
        """The work in this block was told 429: back the machine (or this name) off."""
        Cooldown(self.root).trip(
            seconds, self.name if name_only else None, f"429 reported by slot({self.name!r})"
        )

    # -- sync -----------------------------------------------------------------------------

    def __enter__(self) -> Slot:
        try:
            while True:
                got, pause = self._attempt.step()
                if got is not None:
                    break
                self._stop.wait(pause)
        finally:
            self._attempt.cancel()
        self._started(got)
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release()

    # -- async ----------------------------------------------------------------------------

    async def __aenter__(self) -> Slot:
        try:
            while True:
                got, pause = self._attempt.step()
                if got is not None:
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
        self._release()

    def _started(self, got: Acquired) -> None:
        self.got = got
        if got.claim is not None:
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

"""A block that runs without a slot and says so: seed 003's fail-open when the governor
cannot load or reach anything (`governor.slot`, `governor.client.Slot`)."""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from types import TracebackType

__all__ = ["FailOpen"]


class FailOpen(AbstractContextManager["FailOpen"], AbstractAsyncContextManager["FailOpen"]):
    """A block that runs without a slot, said once on stderr when it starts."""

    held = False

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def _say(self) -> None:
        print(
            f"gov: fail-open: running the block without a {self.name!r} slot: {self.reason}",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> FailOpen:
        self._say()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def __aenter__(self) -> FailOpen:
        self._say()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

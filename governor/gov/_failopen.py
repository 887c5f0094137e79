"""`slot()` that fails open at the import level (seed 003): the drop-in for code that must
run exactly as before when the governor cannot load or reach anything.

    from governor.gov import slot
    with slot("model", max=2, priority="high"):
        run_the_model()

This module imports only the standard library at load. `slot()` loads the SDK's slot
(`governor.client.slot`: governord leases, the machine's semaphore, cooldowns) when it is
called; when that cannot load (grpc or another dependency missing or broken) or cannot be
set up (no usable state directory), the block runs without a slot and one line on stderr
says so and why. A mistake in the arguments (a bad name, `max` out of range) still raises:
that is the caller's bug, not an outage.
"""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from types import TracebackType
from typing import Any

__all__ = ["FailOpen", "slot"]


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


def slot(name: str = "default", **kwargs: Any) -> Any:
    """`governor.client.slot(name, **kwargs)`, or a `FailOpen` block when the SDK cannot
    load (module docstring)."""
    try:
        from governor.client import slot as governed
    except Exception as exc:  # noqa: BLE001 - any failure to load is an outage here
        return FailOpen(name, f"the governor could not load ({type(exc).__name__}: {exc})")
    return governed(name, **kwargs)

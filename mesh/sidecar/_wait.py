"""The sidecar's waiting form: an Admit with ``timeout_ms`` (gRPC `AdmitRequest.timeout_ms`,
the HTTP body's ``timeout_ms``), `await admit(..., timeout_s=)` over the wire.

An item denied in a way waiting can help (its ``retry_after_ms`` is set and falls within the
time left) is asked again when that retry comes, until it is admitted or the deadline would
pass; it is then answered with its last verdict. For a strict limit the first ask after idle
sends governord a reserve, and ``retry_after_ms`` is until the gate may ask again (1 ms while
the reserve is in flight), so the request is served as soon as the block lands. Waiting is
bounded: at most TIMEOUT_MS_MAX per request, at most WAITING_MAX requests waiting at once
(past it a request is answered at once, as without ``timeout_ms``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence

from mesh.sidecar._items import Decider, Item, Outcome

__all__ = ["TIMEOUT_MS_MAX", "WAITING_MAX", "Waiting", "timeout_problem", "waiting_for"]

TIMEOUT_MS_MAX = 30_000  # the longest a request may wait
WAITING_MAX = 1_024  # requests waiting at once on one node
POLL_MIN_MS = 1  # asked again no sooner than this


def timeout_problem(value: object) -> str | None:
    """Why ``value`` is not a ``timeout_ms``, or None."""
    if type(value) is not int or not 0 <= value <= TIMEOUT_MS_MAX:
        return f"timeout_ms: must be an integer from 0 to {TIMEOUT_MS_MAX}, got {value!r}"[:200]
    return None


def _retry_ms(o: Outcome) -> int | None:
    """How long until a denied item could be admitted, or None: admitted, not decided, or
    waiting cannot help."""
    if isinstance(o, str):
        return None
    v, n = o
    if v.allowed:
        return None
    return v.retry_after_ms if n is None else n.retry_after_ms


class Waiting:
    """Waits of one node's sidecar (both front ends share it, so WAITING_MAX is one bound)."""

    def __init__(self) -> None:
        self.waiting = 0  # requests waiting now
        self.waited = 0  # requests that waited
        self.turned_away = 0  # requests answered at once: WAITING_MAX were waiting

    async def admit(
        self, decider: Decider, items: Sequence[Item], *, charge: bool, timeout_ms: int
    ) -> list[Outcome]:
        """The items decided, and asked again while waiting can help within ``timeout_ms``."""
        outcomes = decider.admit(items, charge=charge)
        if timeout_ms <= 0:
            return outcomes
        if self.waiting >= WAITING_MAX:
            self.turned_away += 1
            return outcomes
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeout_ms, TIMEOUT_MS_MAX) / 1000
        self.waiting += 1
        waited = False
        try:
            while True:
                left_ms = (deadline - loop.time()) * 1000
                retries = [(k, _retry_ms(o)) for k, o in enumerate(outcomes)]
                due = [(k, r) for k, r in retries if r is not None and r <= left_ms]
                if not due:
                    return outcomes
                waited = True
                await asyncio.sleep(max(POLL_MIN_MS, min(r for _, r in due)) / 1000)
                again = decider.admit([items[k] for k, _ in due], charge=charge)
                for (k, _), o in zip(due, again, strict=True):
                    outcomes[k] = o
        finally:
            self.waiting -= 1
            self.waited += waited


_waits: weakref.WeakKeyDictionary[Decider, Waiting] = weakref.WeakKeyDictionary()


def waiting_for(decider: Decider) -> Waiting:
    """The waits of the node ``decider`` decides for: one per node, shared by its front
    ends, so WAITING_MAX bounds them together."""
    waits = _waits.get(decider)
    if waits is None:
        waits = _waits[decider] = Waiting()
    return waits

"""Weighted deficit round robin between tenants, for the waiters of one lease class.

Guarantees, while tenants have waiters that fit: grants shared in proportion to weight whatever
the queue lengths; a tenant waits at most one round; work conserving (the tenant's first waiter
that fits is taken, not its head). Not guaranteed (as the seed says): fairness inside a tenant
(strict priority there), fairness of time held, credit for a round that was skipped.

Waiters live only in memory: a waiting acquire is a live call, and a restart fails it cleanly.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ._types import RequestTag

__all__ = ["ClassQueue", "Waiter"]


@dataclass(slots=True)
class Waiter:
    id: int
    session_id: int
    node_id: int
    tenant_id: int
    cls: str
    priority: int
    request: RequestTag | None

    @property
    def order(self) -> tuple[int, int]:
        """Strict priority inside a tenant (higher first), then arrival."""
        return (-self.priority, self.id)


@dataclass(slots=True)
class ClassQueue:
    ring: list[int] = field(default_factory=list)  # tenants with waiters, in ring order
    cursor: int = 0
    deficit: dict[int, int] = field(default_factory=dict)  # grants left in the current turn
    queues: dict[int, list[Waiter]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def tenant_len(self, tenant_id: int) -> int:
        return len(self.queues.get(tenant_id, ()))

    def waiters(self) -> Iterator[Waiter]:
        for tenant_id in self.ring:
            yield from self.queues[tenant_id]

    def push(self, waiter: Waiter) -> None:
        queue = self.queues.get(waiter.tenant_id)
        if queue is None:
            queue = self.queues[waiter.tenant_id] = []
            self.ring.append(waiter.tenant_id)
        keys = [w.order for w in queue]
        queue.insert(bisect.bisect(keys, waiter.order), waiter)

    def pick(
        self, fits: Callable[[Waiter], bool], tenant_blocked: Callable[[int], bool]
    ) -> Waiter | None:
        """The next waiter to grant, or None when no waiter fits; updates the round."""
        n = len(self.ring)
        for i in range(n):
            idx = (self.cursor + i) % n
            tenant_id = self.ring[idx]
            if tenant_blocked(tenant_id):
                continue
            waiter = next((w for w in self.queues[tenant_id] if fits(w)), None)
            if waiter is None:
                continue
            for j in range(i):  # tenants passed over forfeit the rest of their round
                self.deficit[self.ring[(self.cursor + j) % n]] = 0
            self.cursor = idx
            return waiter
        return None

    def granted(self, waiter: Waiter, weight: int) -> None:
        """Account one grant to the waiter's tenant (``pick`` put the cursor on it)."""
        tenant_id = waiter.tenant_id
        left = self.deficit.get(tenant_id, 0) or max(1, weight)
        left -= 1
        self.deficit[tenant_id] = left
        self._remove(waiter)
        if left == 0 and tenant_id in self.queues:
            self.cursor = (self.cursor + 1) % len(self.ring)

    def remove_where(self, pred: Callable[[Waiter], bool]) -> list[Waiter]:
        gone = [w for w in self.waiters() if pred(w)]
        for w in gone:
            self._remove(w)
        return gone

    def _remove(self, waiter: Waiter) -> None:
        queue = self.queues[waiter.tenant_id]
        queue.remove(waiter)
        if queue:
            return
        del self.queues[waiter.tenant_id]
        self.deficit.pop(waiter.tenant_id, None)
        idx = self.ring.index(waiter.tenant_id)
        self.ring.pop(idx)
        if idx < self.cursor:
            self.cursor -= 1
        if self.cursor >= len(self.ring):
            self.cursor = 0

"""Bounded per-tenant wait queues for `admit()`: FIFO inside a tenant, round robin across."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from mesh.core.verdict import Verdict

__all__ = ["Waiter", "TenantQueues"]


class Waiter:
    """One queued admission. `resolve` is the driver's (a future's setter, a sim callback)."""

    __slots__ = ("tenant", "metric", "amount", "deadline_ns", "resolve", "done")

    def __init__(
        self,
        tenant: str,
        metric: str,
        amount: int,
        deadline_ns: int,
        resolve: Callable[[Verdict], None],
    ) -> None:
        self.tenant = tenant
        self.metric = metric
        self.amount = amount
        self.deadline_ns = deadline_ns
        self.resolve = resolve
        self.done = False


class TenantQueues:
    """At most `bound` waiters per tenant; `service` grants in order as capacity appears."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._queues: dict[str, deque[Waiter]] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)  # empty queues are removed, so this is O(1)

    def depth(self, tenant: str) -> int:
        q = self._queues.get(tenant)
        return 0 if q is None else len(q)

    def push(self, w: Waiter) -> bool:
        q = self._queues.get(w.tenant)
        if q is None:
            q = self._queues[w.tenant] = deque()
        if len(q) >= self.bound:
            return False
        q.append(w)
        return True

    def drain(self) -> list[Waiter]:
        """Take every queued waiter out, in queue order per tenant (the node is stopping)."""
        out = [w for q in self._queues.values() for w in q]
        self._queues.clear()
        return out

    def service(
        self,
        now_ns: int,
        try_admit: Callable[[str, str, int], Verdict],
        expired: Callable[[str, str], Verdict],
    ) -> int:
        """Grant what fits now, expire what is past its deadline. Returns waiters resolved.

        Each tenant's queue is served from its head until the head does not fit: a tenant's
        waiters keep their order, and one tenant's backlog never blocks another's.
        """
        resolved = 0
        for tenant in list(self._queues):
            q = self._queues[tenant]
            while q:
                w = q[0]
                if w.done:
                    q.popleft()
                    continue
                if w.deadline_ns <= now_ns:
                    q.popleft()
                    w.done = True
                    w.resolve(expired(w.tenant, w.metric))
                    resolved += 1
                    continue
                verdict = try_admit(w.tenant, w.metric, w.amount)
                if not verdict.allowed:
                    break
                q.popleft()
                w.done = True
                w.resolve(verdict)
                resolved += 1
            if not q:
                del self._queues[tenant]
        return resolved

"""An in-process coordinator: versioned policies with watchers.

governord serves the same API durably, with auth (docs/policies.md); this store is the
in-memory one behind `mesh.testing.coordinator.CoordinatorServer`, for tests and `mesh bench policy
--in-process`. A put never changes a generation: it creates the next one for that
(tenant, metric).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from mesh.coordinator._source import PolicySnapshot
from mesh.core.policy import TenantRatePolicy
from mesh.errors import ConfigError

__all__ = ["PolicyStore"]


class PolicyStore:
    def __init__(self, policies: tuple[TenantRatePolicy, ...] = ()) -> None:
        self._by_key: dict[tuple[str, str, int], TenantRatePolicy] = {}
        self.revision = 0
        self._changed: asyncio.Event | None = None
        for p in policies:
            self._by_key[(p.tenant_id, p.metric, p.generation)] = p
            self.revision += 1

    def put(self, data: dict[str, Any] | TenantRatePolicy) -> TenantRatePolicy:
        """Store a policy as a new generation of its (tenant, metric); returns it."""
        raw = data.to_dict() if isinstance(data, TenantRatePolicy) else dict(data)
        raw.setdefault("generation", 1)
        probe = TenantRatePolicy.from_dict(raw, error=ConfigError)  # validates, naming the field
        gens = [g for (t, m, g) in self._by_key if t == probe.tenant_id and m == probe.metric]
        policy = replace(probe, generation=max(gens, default=0) + 1)
        self._by_key[(policy.tenant_id, policy.metric, policy.generation)] = policy
        self.revision += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        return policy

    def snapshot(self) -> PolicySnapshot:
        return PolicySnapshot(self.revision, tuple(self._by_key[k] for k in sorted(self._by_key)))

    async def close(self) -> None:
        pass  # in process: nothing to release

    async def list(self) -> PolicySnapshot:
        return self.snapshot()

    async def watch(self, after_revision: int) -> AsyncIterator[PolicySnapshot]:
        seen = after_revision
        while True:
            if self.revision > seen:
                snap = self.snapshot()
                seen = snap.revision
                yield snap
                continue
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()

"""Keeps a worker's PolicyCache current from a PolicySource.

Watch first; when the watch fails, poll every `poll_ttl_s` (and try the watch again after
each poll). Admission never waits on this: it reads the cache, and a generation not yet
learned is `policy_unknown` (fail closed, seed 004).
"""

from __future__ import annotations

import asyncio
import logging

from mesh.coordinator._source import PolicySnapshot, PolicySource
from mesh.core.policy import PolicyCache, RateKey
from mesh.errors import ConfigError, MeshError

__all__ = ["PolicyFeed"]

log = logging.getLogger("mesh.policy")


class PolicyFeed:
    def __init__(self, source: PolicySource, cache: PolicyCache, *, poll_ttl_s: float) -> None:
        self.source = source
        self.cache = cache
        self.poll_ttl_s = poll_ttl_s
        self.revision = 0
        self.watching = False
        self.reachable = False
        self.last_error = ""
        self.conflicts = 0

    def apply(self, snap: PolicySnapshot) -> bool:
        """Learn every generation in `snap`; a conflicting one is skipped and logged.

        A revision lower than the last one means the coordinator was reset: its answer is
        still applied (known generations never change meaning; the cache refuses that)."""
        self.revision = snap.revision
        self.reachable = True
        changed = False
        for p in snap.policies:
            try:
                changed |= self.cache.put(p)
            except ConfigError as exc:
                self.conflicts += 1
                log.warning("coordinator policy refused: %s", exc)
        for t in snap.removed:
            changed |= self.cache.remove(t.tenant_id, t.metric, t.generation)
        return changed

    async def run(self) -> None:
        while True:
            try:
                async for snap in self.source.watch(self.revision):
                    self.watching = True
                    self.apply(snap)
            except MeshError as exc:
                self.reachable = False  # said at once (the node's dependency probe)
                self.last_error = str(exc)
            self.watching = False
            await asyncio.sleep(self.poll_ttl_s)
            await self.poll()

    async def poll(self) -> bool:
        try:
            return self.apply(await self.source.list())
        except MeshError as exc:
            self.reachable = False
            self.last_error = str(exc)
            return False

    async def fetch(self, key: RateKey) -> bool:
        """An owner needs this exact generation: list now. True if it is known after."""
        if self.cache.get(key) is None:
            await self.poll()
        return self.cache.get(key) is not None

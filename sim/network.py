"""The simulated network between every pair of members: latency with jitter, loss,
duplication (and so reordering), partitions that start and heal, and outages."""

from __future__ import annotations

import random

from mesh.core.config import MS
from sim.scenario import NetworkSpec

__all__ = ["ScenarioNetwork"]


class ScenarioNetwork:
    """Implements mesh.testing.fleet.Network from a scenario's NetworkSpec.

    One-way delay = latency + a uniform jitter in [0, 2 x jitter_ms] (mean `jitter_ms`), so
    messages overtake each other. A member inside an active partition set reaches
    no one outside it, and no one outside reaches it.
    """

    def __init__(self, spec: NetworkSpec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng
        self.base_ns = int(spec.latency_ms * MS)
        self.jitter_ns = spec.jitter_ms * MS
        self.span_ns = int(2 * self.jitter_ns)
        self.partitions: list[frozenset[str]] = []  # active ones
        self.down: set[str] = set()  # members (e.g. "central") that answer nothing
        self.max_delay_ns = 0

    def delay_ns(self) -> int:
        d = self.base_ns + (self.rng.randint(0, self.span_ns) if self.span_ns else 0)
        if d > self.max_delay_ns:
            self.max_delay_ns = d
        return d

    def perfect(self) -> bool:
        """No loss, no partitions, nothing down: every message arrives (a fast path)."""
        return not self.spec.loss and not self.partitions and not self.down

    def reachable(self, src: str, dst: str) -> bool:
        if not self.partitions and not self.down:
            return True
        if src in self.down or dst in self.down:
            return False
        return all((src in p) == (dst in p) for p in self.partitions)

    def transit(self, src: str, dst: str, now_ns: int) -> list[int]:
        if not self.reachable(src, dst) or self.rng.random() < self.spec.loss:
            return []
        copies = 2 if self.rng.random() < self.spec.duplicate else 1
        return [self.delay_ns() for _ in range(copies)]

    def nominal_delay_ns(self) -> int:
        """A generous one-way delay for bounds when nothing was measured."""
        return self.base_ns + self.span_ns

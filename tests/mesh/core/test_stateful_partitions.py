"""The envelope through partitions long enough for floors (issue 12, docs/partitions.md):
the state machine of test_stateful with more rules, a worker cut off past its floor's wait
while it keeps being offered work, and a sparse reporter whose pauses look like cuts to its
owner. Every window is still checked against B + R*(window) + N*b + R*d after every step,
and a floor that is open is never above what the owner escrows for it (the floor follows
the usage the worker knows the owner counted; the owner escrows at least that). The seed
of each run is the `seed` step hypothesis prints with a failing example."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from mesh.core.config import MS, CoreConfig
from tests.mesh.core.test_stateful import WORKERS, MeshMachine

pytestmark = pytest.mark.slow  # hypothesis state machine: tens of seconds


class FloorMachine(MeshMachine):
    CONFIG = CoreConfig()  # floors on: the default

    @rule(w=st.sampled_from(WORKERS), ms=st.integers(60, 400), per_ms=st.integers(0, 3))
    def long_cut(self, w: str, ms: int, per_ms: int) -> None:
        """Cut a worker off for `ms` (past its floor's wait when long enough), offering it
        `per_ms` requests a millisecond, and the others as much, all the while."""
        self.partition(w, ms)
        end = self.now + ms * MS
        while self.now < end:
            self.run_to(self.now + MS)
            if per_ms:
                for x in WORKERS:
                    self.admit(x, per_ms)

    @rule(w=st.sampled_from(WORKERS), gap_ms=st.integers(20, 120), n=st.integers(2, 8))
    def sparse(self, w: str, gap_ms: int, n: int) -> None:
        """A worker that uses the key now and then: one unit every `gap_ms`, `n` times, so
        its owner sees pauses that look like cuts and escrows them."""
        for _ in range(n):
            self.admit(w, 1)
            self.run_to(self.now + gap_ms * MS)

    @rule(w=st.sampled_from(WORKERS), ms=st.integers(120, 400), gap_ms=st.integers(2, 12))
    def light_cut(self, w: str, ms: int, gap_ms: int) -> None:
        """The case floors are for: a worker that uses the key lightly (a unit every
        `gap_ms`, below its share, so it is not refused and its owner counts its usage) for
        100 ms, then keeps doing so through a cut long enough for its floor to open."""
        for _ in range(100 // gap_ms):
            self.admit(w, 1)
            self.run_to(self.now + gap_ms * MS)
        self.partition(w, ms)
        end = self.now + ms * MS
        while self.now < end:
            self.admit(w, 1)
            self.run_to(min(end, self.now + gap_ms * MS))

    @invariant()
    def floors_within_escrow(self) -> None:
        for w in WORKERS:
            v = self.gate(w)
            if v is None or v.floor is None:
                continue
            owner = self.members[v.snap_from].owner
            ks = owner.keys.get(v.key)
            e = (ks.escrow or {}).get(w) if ks is not None else None
            if e is not None and e.back_ns < 0 and e.from_ns == owner.escrows.heard.get(w):
                assert v.floor_ppm <= e.part_ppm, (w, v.floor_ppm, e)


# No `target` phase: hill-climbing the worst window through cuts of hundreds of steps each
# took the state machine past ten minutes; the random cuts are what this test is for.
FloorMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
)
TestFloorEnvelope = FloorMachine.TestCase

"""The envelope through partitions long enough for floors (issue 12, docs/partitions.md):
the state machine of test_stateful with one more rule, a worker cut off past its floor's
wait while it keeps being offered work. Every window is still checked against
B + R*(window) + N*b + R*d after every step."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from mesh.core.config import MS, CoreConfig
from tests.mesh.core.test_stateful import WORKERS, MeshMachine

pytestmark = pytest.mark.slow  # hypothesis state machine: tens of seconds


class FloorMachine(MeshMachine):
    CONFIG = CoreConfig(partition_floor_ms=2000)

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


# No `target` phase: hill-climbing the worst window through cuts of hundreds of steps each
# took the state machine past ten minutes; the random cuts are what this test is for.
FloorMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
)
TestFloorEnvelope = FloorMachine.TestCase

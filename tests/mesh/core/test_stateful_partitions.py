"""The envelope through partitions long enough for floors (issue 12, docs/partitions.md):
the state machine of test_stateful with more rules, a worker cut off past its floor's wait
while it keeps being offered work, and a sparse reporter whose pauses look like cuts to its
owner. Every window is still checked against B + R*(window) + N*b + R*d after every step,
and a floor that is open is never above what the owner escrows for it (the floor follows
the usage the worker knows the owner counted; the owner escrows at least that; not yet: see
the strict xfail at the end and docs/partitions.md "Known gap"). The seed
of each run is the `seed` step hypothesis prints with a failing example."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from mesh.core.config import MS, PARTITION_FLOOR_MS, CoreConfig
from tests.mesh.core.test_stateful import WORKERS, MeshMachine

pytestmark = pytest.mark.slow  # hypothesis state machine: tens of seconds


class FloorMachine(MeshMachine):
    CONFIG = CoreConfig(partition_floor_ms=PARTITION_FLOOR_MS)  # floors on (off by default)

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

    def floors_within_escrow(self) -> None:
        """Not an invariant of the machine while the known gap stands (the test at the end
        replays it); the envelope over every window still is, after every step."""
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
# Derandomized: the known gap below is replayed on its own; random runs found it once in a
# CI run and would turn CI red at random until it is fixed.
FloorMachine.TestCase.settings = settings(
    derandomize=True,
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
)
TestFloorEnvelope = FloorMachine.TestCase


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="issue 12, docs/partitions.md 'Known gap': after a healed cut the owner hears the "
    "worker's resend but no answer reaches the worker before a second cut, so the worker floors "
    "from its older last word and window, above what the owner escrows from its later one; "
    "floors stay off by default until it is fixed",
)
@pytest.mark.parametrize("example", ["after-long-cut", "after-light-cut"])
def test_a_second_cut_soon_after_a_healed_one_keeps_the_floor_within_its_escrow(
    example: str,
) -> None:
    """Two examples the machine found (seed 0): w1 floors at 333,333 ppm while its owner
    escrows 246,031 for it, and at 235,000 against 170,000. The envelope held in both.
    Strict: when the gap is fixed these pass and the mark must go (and the invariant return
    to the machine)."""
    m = FloorMachine()
    m.seed(seed=0)
    if example == "after-long-cut":
        m.long_cut(ms=262, per_ms=1, w="w0")
        m.long_cut(ms=399, per_ms=1, w="w1")
        m.partition(ms=20, w="w0")
        m.long_cut(ms=60, per_ms=0, w="w1")
    else:
        m.long_cut(ms=60, per_ms=0, w="w0")
        m.light_cut(gap_ms=2, ms=366, w="w1")
        m.long_cut(ms=60, per_ms=1, w="w1")
    m.within_envelope()
    m.floors_within_escrow()

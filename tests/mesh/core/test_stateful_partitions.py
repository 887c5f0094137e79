"""The envelope through partitions long enough for floors (docs/partitions.md):
the state machine of test_stateful with more rules, a worker cut off past its floor's wait
while it keeps being offered work, and a sparse reporter whose pauses look like cuts to its
owner. Every window is still checked against B + R*(window) + N*b + R*d after every step,
and a floor that is open is never above what the owner escrows for it, nor open before the
moment the escrow charges from (both count from the owner's batch the worker confirmed last;
docs/partitions.md). The seed of each run is the `seed` step hypothesis prints with a
failing example."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

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

    @invariant()
    def floors_within_escrow(self) -> None:
        """An open floor is covered by its owner's escrow: the owner counts from a moment no
        later than the worker's last word from it (its anchor), it would escrow the key for
        the worker, and at no less than the floor's part. The owner opens an escrow lazily,
        at its first look at the key (and charges it from the anchor then): until it has,
        what it would open is checked."""
        for w in WORKERS:
            v = self.gate(w)
            if v is None or v.floor is None:
                continue
            owner = self.members[v.snap_from].owner
            since = self.members[w].reporter._heard[v.snap_from]
            if v.inflight and v.inflight[0].created_ns > since:
                since = v.inflight[0].created_ns
            peer = owner.escrows.peers[w]
            ks = owner.keys[v.key]
            rs = ks.reporters[w]
            anchor = max(owner.escrows.anchor(peer), rs.row_anchor)
            # No later than a TTL after its floor's wait began (its floor opens `quiet` and
            # a TTL after that, holding what `quiet` earns: the escrow charges from before).
            assert 0 <= anchor <= since + owner.config.snapshot_ttl_ns, (w, anchor, since)
            assert not peer.idle, w
            assert rs.sent_at_ns >= anchor - owner.config.escrow_recent_ns, (w, rs.sent_at_ns)
            e = (ks.escrow or {}).get(w)
            if e is not None and e.back_ns < 0:  # charging: from the anchor or before it
                assert e.from_ns <= anchor, (w, e, anchor)
                assert v.floor_ppm <= e.part_ppm, (w, v.floor_ppm, e)
            else:  # none, or one that stopped before this floor's wait began: it opens anew
                assert e is None or e.from_ns != anchor, (w, e, anchor)
                assert v.floor_ppm <= max(rs.share_cur, rs.share_prev), (w, v.floor_ppm, rs)


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


@pytest.mark.parametrize("example", ["after-long-cut", "after-light-cut"])
def test_a_second_cut_soon_after_a_healed_one_keeps_the_floor_within_its_escrow(
    example: str,
) -> None:
    """Two examples the machine found (seed 0) with the floors of the design before (each
    side counting from its own last word): w1 floored at 333,333 ppm while its owner
    escrowed 246,031 for it, and at 235,000 against 170,000 (docs/partitions.md)."""
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

"""The bucket's one formula (``_bucket.level_at``) against a millisecond-by-millisecond
simulation of the token bucket it stands for, on random histories (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from governor.engine import Rate
from governor.engine._bucket import MILLI, Bucket, level_at


def stepwise(bucket: Bucket, now_ms: int) -> int:
    """Each millisecond m in [at, now): refill R milliunits, capped at B minus the blocks
    still outstanding at m; a level above the cap (a lowered burst) stays where it is."""
    level = bucket.level_mu
    for m in range(bucket.at_ms, now_ms):
        out = sum(u for u, exp in bucket.blocks.values() if exp > m)
        cap = (bucket.rate.burst - out) * MILLI
        if level < cap:
            level = min(cap, level + bucket.rate.per_s)
    return level


_BLOCKS = st.dictionaries(
    st.integers(1, 50), st.tuples(st.integers(1, 20), st.integers(0, 400)), max_size=6
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2_000),
    st.integers(1, 60),
    st.integers(0, 60_000),
    _BLOCKS,
    st.integers(0, 400),
)
def test_level_at_equals_the_stepwise_bucket(
    per_s: int, burst: int, level_mu: int, blocks: dict[int, tuple[int, int]], dt: int
) -> None:
    bucket = Bucket(
        Rate(per_s, burst), level_mu, 100, {b: (u, 100 + e) for b, (u, e) in blocks.items()}
    )
    assert level_at(bucket, 100 + dt) == stepwise(bucket, 100 + dt)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2_000), st.integers(1, 60), _BLOCKS, st.integers(0, 400))
def test_level_plus_outstanding_stays_within_the_burst(
    per_s: int, burst: int, blocks: dict[int, tuple[int, int]], dt: int
) -> None:
    """From any state that keeps the invariant, it is kept at every later instant."""
    out0 = sum(u for u, _ in blocks.values())
    if out0 > burst:
        return
    bucket = Bucket(Rate(per_s, burst), (burst - out0) * MILLI // 2, 0, dict(blocks))
    level = level_at(bucket, dt)
    assert 0 <= level and level + bucket.outstanding(dt) * MILLI <= burst * MILLI

"""The share formulas (mesh.core.shares) and every copy of them the owner's reply inlines.

`Owner.receive` inlines `share_basis`, `shares_even` and `share_step` (is the split even?),
`share_ppm` (a reporter's share when it follows demand), `near` (does a reply leave what the
tick last looked at unchanged?), `gcra.recovered` (the exhaustion hysteresis) and
`snapshot_allowance_ppm` for a sole reporter. The pins below drive the real owner through
`receive` on random states, on both sides of each branch, and compare what it sent and
decided with the helpers: a formula changed in one place and not the other fails here.
Hypothesis runs derandomized (tests/conftest.py): a failure prints its example and replays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from mesh.core.config import CoreConfig
from mesh.core.effects import Send
from mesh.core.gcra import Gcra, recovered
from mesh.core.messages import RateSnapshot, ReportBatch, SnapshotBatch, UsageReport
from mesh.core.owner import KeyState, Owner
from mesh.core.policy import RateKey
from mesh.core.ring import Ring
from mesh.core.shares import (
    PPM,
    ShareBasis,
    allowance_cap_ppm,
    even_part_ppm,
    near,
    share_basis,
    share_ppm,
    share_round,
    share_step,
    shares_even,
    snapshot_allowance_ppm,
)
from tests.mesh._helpers import MS, cache, owned_policies, policy

NOW = 10_000 * MS  # the owner has held its position long enough for keys to start full
# The owner and every reporter the drawn states have (w0..w5), all members of its ring, and a
# tenant the owner holds there.
RING = Ring(["o", *(f"w{i}" for i in range(6))], 1)
TENANT = owned_policies(RING, "o", 1)[0].tenant_id


# -- the owner's inlined copies, pinned to the helpers -------------------------------------


@dataclass
class State:
    """One key at its owner just before a report, and what the tick last looked at."""

    n: int  # live reporters w0..
    burst: int
    b: int
    floor_ppm: int
    remaining: int
    demands: list[int]  # each reporter's denied usage so far (its demand)
    exhausted: bool
    sender: int  # who reports next
    # The tick's last look, as offsets from the truth: the live count, the even allowance
    # and min(remaining, b) (small offsets straddle "near").
    looked_offsets: tuple[int, int, int] = (0, 0, 0)


def _basis(s: State) -> ShareBasis:
    return share_basis(s.remaining, s.burst, s.floor_ppm, s.n, sum(s.demands))


def _even_allowance(s: State) -> int:
    """What an even share of the key lets a reporter spend (ppm)."""
    return snapshot_allowance_ppm(s.remaining, _basis(s).even_ppm, s.n, s.b)


def _around(x: int) -> st.SearchStrategy[int]:
    """Offsets from `x` on both sides of "near" (within 1/65,536 of it) and of twice that:
    0, 1/2, 1, 3/2 and 2 times x/65,536, either sign, give or take one."""
    unit = abs(x) >> 16
    return st.builds(
        lambda halves, sign, jitter: sign * (halves * unit // 2) + jitter,
        st.integers(0, 4),
        st.sampled_from([-1, 1]),
        st.integers(-1, 1),
    )


@st.composite
def states(draw: st.DrawFn) -> State:
    n = draw(st.integers(1, 6))
    burst = draw(st.one_of(st.integers(1, 200), st.integers(1, 10**9)))
    b = draw(st.integers(1, burst))
    floor_ppm = draw(st.one_of(st.just(CoreConfig().share_floor_ppm), st.integers(1, PPM)))
    demands = draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n))
    # Around the edge of the even split as well as anywhere: the bucket is even when at
    # least about 1 - 1/(64 n) full, and a spread of exactly one step is not even.
    edge = burst - burst // (64 * n + 1)
    one_step = [
        r
        for r in range(max(0, edge - 200), min(burst, edge + 200) + 1)
        if (basis := share_basis(r, burst, floor_ppm, n, 0)).spread_ppm
        == share_step(basis.even_ppm)
    ]
    remaining = draw(
        st.one_of(
            st.integers(0, burst),
            st.integers(max(0, edge - 3), min(burst, edge + 3)),
            st.sampled_from(one_step or [edge]),
            st.just(burst),
        )
    )
    s = State(
        n, burst, b, floor_ppm, remaining, demands, draw(st.booleans()), draw(st.integers(0, n - 1))
    )
    s.looked_offsets = (
        draw(st.sampled_from([0, 0, -1, 1])),
        draw(_around(_even_allowance(s))),
        draw(_around(min(remaining, b))),
    )
    return s


def _owner_at(s: State) -> tuple[Owner, RateKey, KeyState]:
    """An owner whose key has `s.n` live reporters w0.. with the drawn demands, and a meter
    with exactly `s.remaining` left at NOW (R = 1/s: 5 ms later, still exactly that)."""
    p = policy(TENANT, rate=1, burst=s.burst, b=s.b)
    o = Owner("o", RING, cache(p), 0, config=CoreConfig(share_floor_ppm=s.floor_ppm))
    key = p.rate_key
    for i, d in enumerate(s.demands):
        o.receive(
            NOW, ReportBatch.of(f"w{i}", 1, [UsageReport(key, f"w{i}", 1, 1, denied_delta=d)])
        )
    ks = o.keys[key]
    ks.meter = Gcra(1, s.burst, NOW)
    ks.meter.apply(NOW, s.burst - s.remaining)
    ks.exhausted = s.exhausted
    return o, key, ks


def _reply(o: Owner, now_ns: int, key: RateKey, worker: str) -> RateSnapshot:
    effects = o.receive(now_ns, ReportBatch.of(worker, 1, [UsageReport(key, worker, 1, 2)]))
    [row] = [
        r
        for e in effects
        if isinstance(e, Send) and e.to == worker and isinstance(e.message, SnapshotBatch)
        for r in e.message.snapshots
    ]
    return row


EVEN = State(2, 100_000, 50, 62_500, 99_990, [3, 4], False, 0)  # a spread below one step
SCARCE = State(3, 100, 20, 62_500, 10, [0, 40, 300], False, 1)  # shares follow demand


@given(states())
@example(EVEN)
@example(replace(EVEN, looked_offsets=(0, 0, 1)))  # the floor moved: not near
@example(replace(EVEN, looked_offsets=(1, 0, 0)))  # another live count
@example(replace(EVEN, burst=1_000_000, remaining=992_249, demands=[7, 0]))  # one step: not even
@example(SCARCE)
@example(replace(SCARCE, n=1, demands=[5], sender=0))  # the sole reporter
@example(replace(SCARCE, remaining=13, exhausted=True))  # recovered: an eighth is back
@example(replace(SCARCE, remaining=12, exhausted=True))  # not yet
@example(replace(SCARCE, remaining=0))  # exhausted now
@settings(max_examples=400)
def test_the_reply_fast_path_equals_the_share_helpers(s: State) -> None:
    """A report's reply: the share, the allowance noted for it, whether the other reporters
    are owed a refresh (the inlined `shares_even` and `near` against the tick's last look)
    and the exhaustion hysteresis (`recovered`), all as the helpers say."""
    o, key, ks = _owner_at(s)
    floor = min(s.remaining, s.b)
    basis = _basis(s)
    dn, da, df = s.looked_offsets
    if s.n > 1:
        share = share_ppm(basis, s.demands[s.sender])
        allowance = snapshot_allowance_ppm(s.remaining, share, s.n, s.b)
        # The tick's last look, near the truth or not; its allowance is an even share's
        # (as if the split was even then), so only `shares_even` tells the two apart.
        looked_n, looked_allowance, looked_floor = s.n + dn, _even_allowance(s) + da, floor + df
        ks.looked_n, ks.looked_allowance_ppm, ks.looked_floor = (
            looked_n,
            looked_allowance,
            looked_floor,
        )
        unchanged = (
            shares_even(basis)
            and looked_n == s.n
            and near(allowance, looked_allowance)
            and near(floor, looked_floor)
        )
    else:
        share = PPM  # the only live reporter: the whole budget is its share
        allowance = snapshot_allowance_ppm(s.remaining, PPM, 1, s.b)
        unchanged = True  # no one else to refresh
    changes = ks.changes
    row = _reply(o, NOW, key, f"w{s.sender}")
    assert (row.remaining, row.active_reporters, row.share_ppm) == (s.remaining, s.n, share)
    assert ks.reporters[f"w{s.sender}"].sent_allowance_ppm == allowance
    assert ks.changes == changes + (0 if unchanged else 1)
    if s.remaining == 0:
        assert ks.exhausted
    else:
        assert ks.exhausted == (s.exhausted and not recovered(s.remaining, s.burst))


@given(states())
@example(EVEN)
@example(SCARCE)
@settings(max_examples=200)
def test_the_ticks_look_and_the_replys_check_of_it_agree(s: State) -> None:
    """The tick's look (`_look`, through the helpers), then a report with nothing changed
    in between: an even split owes no refresh; a split by demand has the tick look again."""
    o, key, ks = _owner_at(s)
    later = NOW + CoreConfig().sync_interval_ms * MS  # w0 is due: the tick looks at the key
    o.tick(later)
    basis = _basis(s)
    if s.n > 1:
        assert (ks.looked_n, ks.looked_allowance_ppm, ks.looked_floor) == (
            s.n,
            _even_allowance(s) if shares_even(basis) else -1,
            min(s.remaining, s.b),
        )
    changes = ks.changes
    row = _reply(o, later, key, f"w{s.sender}")
    assert row.share_ppm == (share_ppm(basis, s.demands[s.sender]) if s.n > 1 else PPM)
    if s.n > 1:
        assert (ks.changes == changes) == shares_even(basis)


def test_the_examples_reach_both_sides_of_every_inlined_branch() -> None:
    assert shares_even(_basis(EVEN)) and not shares_even(_basis(SCARCE))
    basis = _basis(replace(EVEN, burst=1_000_000, remaining=992_249))
    assert basis.spread_ppm == share_step(basis.even_ppm) and not shares_even(basis)
    assert near(65_536, 65_537) and not near(65_536, 65_534)
    assert recovered(13, 100) and not recovered(12, 100)


# -- the helpers' own properties -----------------------------------------------------------


@st.composite
def bases(draw: st.DrawFn) -> tuple[ShareBasis, list[int], int]:
    burst = draw(st.integers(1, 10**9))
    remaining = draw(st.integers(0, burst))
    floor_ppm = draw(st.integers(1, PPM))
    demands = draw(st.lists(st.integers(0, 10**9), min_size=1, max_size=50))
    basis = share_basis(remaining, burst, floor_ppm, len(demands), sum(demands))
    return basis, demands, remaining


@given(bases())
@settings(max_examples=500)
def test_shares_sum_to_at_most_one_unit(drawn: tuple[ShareBasis, list[int], int]) -> None:
    basis, demands, _ = drawn
    shares = [share_ppm(basis, d) for d in demands]
    assert all(0 <= s <= PPM for s in shares)
    assert sum(shares) <= PPM
    if shares_even(basis):
        assert set(shares) == {basis.even_ppm}
    # Demand moves a share in whole steps above the even part.
    step = share_step(basis.even_ppm)
    if sum(demands):
        assert all((s - basis.even_ppm) % step == 0 or shares_even(basis) for s in shares)


@given(bases(), st.integers(1, 10**9))
@settings(max_examples=500)
def test_fleet_allowances_never_exceed_remaining_nor_the_cap(
    drawn: tuple[ShareBasis, list[int], int], b: int
) -> None:
    basis, demands, remaining = drawn
    allowances = [
        snapshot_allowance_ppm(remaining, share_ppm(basis, d), basis.active, b) for d in demands
    ]
    caps = []
    for d, a in zip(demands, allowances, strict=True):
        share = share_ppm(basis, d)
        cap = allowance_cap_ppm(share, basis.active, b)
        caps.append(cap)
        assert 0 <= a <= remaining * share
        assert a <= cap <= b * PPM
        # Never below the older releases' cap (b / n, or b x share), and that cap exactly
        # for a share at or below the even one.
        assert cap >= max(b * PPM // basis.active, b * share)
        if share * basis.active <= PPM:
            assert cap == b * PPM // basis.active
    assert sum(allowances) <= remaining * PPM
    if len(demands) == basis.active:  # every live reporter: their caps sum to at most 3b
        assert sum(caps) <= 3 * b * PPM


@given(st.integers(0, 10**12), st.integers(0, PPM - 1), st.integers(0, PPM - 1))
def test_share_round_is_exact_in_expectation(amount_ppm: int, coin: int, other: int) -> None:
    """Over a uniform coin in [0, 1e6) the rounded value averages amount / 1e6 exactly: it is
    the whole part plus one on exactly `frac` of the coins, the lowest ones."""
    whole, frac = divmod(amount_ppm, PPM)
    assert share_round(amount_ppm, coin) == whole + (1 if coin < frac else 0)
    lo, hi = sorted((coin, other))
    assert share_round(amount_ppm, lo) >= share_round(amount_ppm, hi)  # monotone in the coin
    # So exactly the coins 0 .. frac-1 round up: the mean over all 1e6 coins is
    # whole + frac / 1e6 == amount_ppm / 1e6.
    assert share_round(amount_ppm, frac) == whole
    if frac:
        assert share_round(amount_ppm, frac - 1) == whole + 1


@given(st.integers(0, 10**9), st.integers(1, 10**9), st.integers(1, PPM))
def test_the_even_part_lies_between_the_floor_and_one(
    remaining: int, burst: int, floor_ppm: int
) -> None:
    remaining = min(remaining, burst)
    even = even_part_ppm(remaining, burst, floor_ppm)
    assert floor_ppm <= even <= PPM
    assert even == max(remaining * PPM // burst, floor_ppm)


@given(st.integers(0, 10**12), st.integers(-1, 10**12))
def test_near_is_within_one_part_in_65536(now: int, then: int) -> None:
    assert near(now, then) == (then >= 0 and abs(now - then) * 65_536 <= then)
    assert near(now, now)
    assert not near(now, -1)  # an unset value is never near


@given(st.integers(0, 10**12))
def test_the_step_is_a_64th_of_the_even_part_and_never_zero(even_ppm: int) -> None:
    assert share_step(even_ppm) == max(1, even_ppm // 64)

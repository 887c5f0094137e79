"""How a limit is divided between workers: every share formula of the mesh, in one place.

Shares are carried in parts per million (ppm) of a unit, so that the owner's arithmetic is
exact integers and a worker's part of a small budget (20 units over 300 workers) is not lost
to rounding.

A key's owner splits what remains in two: an even part, as large as the bucket is full and
never below the configured floor, shared equally by the reporters with a live lease, and the
rest (the spread), shared by recent demand (used + denied) in steps of 1/64 of a reporter's
even part. A full bucket that recent demand leaves mostly untouched is plenty for everyone,
so an even split lets any worker start at once; a nearly empty one is scarce, so it goes
where the requests are. So is a full one that recent demand is draining (`plenty`): a flash
crowd on a cold key comes through a skewed load balancer, and an even split would hand its
busiest worker b / N while the others hold shares they do not use. The per-key
half of that is a `ShareBasis` (once per key per round); `share_ppm` finishes one
reporter's share.

A worker cut off from a key's owner spends its floor: the least of its share from the owner's
last row, the ring's even share (so the floors of all members sum to at most R) and
FLOOR_HEADROOM times its recent usage of the key, none if it was refused as much
(`floor_demand_ppm`, from the `UsageWindow`s both sides keep of the reports the owner
applied), of R per second (`floor_ppm`), with a burst of a lease of it
(`floor_burst`) of which it holds only what the owner's escrow has already charged when the
floor opens (`floor_start`); the owner charges at least that rate as escrow (`floor_units`,
docs/partitions.md).

The owner's reply path (`Owner.receive`) runs for every report and inlines `share_basis`
(calling `plenty` and `even_part_ppm`), `share_step`, `shares_even`, `share_ppm` and `near`
for speed (a `ShareBasis` per report costs more than the arithmetic);
tests/mesh/core/test_shares.py and test_cold_start.py pin each inlined copy to the function
here on random inputs, so a change here that is not made there too fails a test. The owner's
`Escrows.promise` inlines `floor_ppm` of `floor_demand_ppm` (once per row sent), pinned the
same way by tests/mesh/core/test_partition_floor.py.
"""

from __future__ import annotations

__all__ = [
    "PPM",
    "GRAIN_BITS",
    "NEAR_BITS",
    "ShareBasis",
    "share_of",
    "share_round",
    "snapshot_allowance_ppm",
    "allowance_cap_ppm",
    "even_part_ppm",
    "plenty",
    "refill_units",
    "DEMAND_PART",
    "OVERLOAD",
    "share_step",
    "share_basis",
    "shares_even",
    "share_ppm",
    "near",
    "floor_ppm",
    "floor_units",
    "floor_burst",
    "floor_start",
    "floor_demand_ppm",
    "FLOOR_HEADROOM",
    "UsageWindow",
]

PPM = 1_000_000
# The part of a share that follows demand moves in steps of 1/2**GRAIN_BITS (1/64) of the
# even part (rounded down, so shares still sum to at most one). Below one step, shares are
# even: in a bucket that is nearly full, demand moves no one's allowance, and no refresh is
# owed for it.
GRAIN_BITS = 6
# A refresh is owed when what a reporter may spend would move by more than 1/2**NEAR_BITS
# (1/65,536) of what it holds (3/65,536 at most in all, with the rounding of shares and the
# reply's check against the tick's last look): below that is the rounding of shares (ppm)
# and of a bucket that refills between two reports, which would otherwise send every key of
# a busy owner every interval.
NEAR_BITS = 16
# A bucket is plenty for its reporters (`plenty`) while their recent demand (used + denied
# over the current and previous demand window: 20 to 40 ms by default) stays below
# 1/DEMAND_PART of what remains, or below OVERLOAD times what the rate refills over the span
# that demand covers. The first catches a crowd on a full bucket from its first reports
# (measured on flash-crowd: 1 and 2 react only once the burst is half spent, 4 and more from
# the start); the second keeps a key that demand does not drain (a quiet tenant below its
# rate, whose demand comes in lumps beside a small bucket: noisy-neighbour's) on its even
# split, so an idle worker's next request finds an even share ready, not the floor's
# sliver of one. With partition floors on (half-partition), OVERLOAD 1 let the denials that
# a healed partition's workers report at once count as a drain: half-partition's quiet
# tenant fell to 0.989 (20 seeds, min); at 2 it gets 0.990, flash-crowd 0.965 (0.968 at 1),
# and noisy-neighbour and the rest measure the same as at 1.
DEMAND_PART = 4
OVERLOAD = 2


class ShareBasis:
    """The per-key half of the shares (`share_basis`); `share_ppm` finishes one reporter's.

    A slotted class, not a NamedTuple: the owner's tick reads it for every receiver, and on
    CPython 3.11 a NamedTuple field read goes through an unspecialised descriptor (about four
    times a slot read) and its constructor is a Python-level `__new__`; measured with
    callgrind, a NamedTuple here cost the tick about 4% more instructions than this.
    """

    __slots__ = ("active", "demand", "spread_ppm", "even_ppm")

    def __init__(self, active: int, demand: int, spread_ppm: int, even_ppm: int) -> None:
        self.active = active  # reporters with a live lease (at least 1)
        self.demand = demand  # their recent demand (used + denied), summed
        self.spread_ppm = spread_ppm  # the part of the budget shared by demand
        self.even_ppm = even_ppm  # the even part each active reporter gets

    def __repr__(self) -> str:
        return (
            f"ShareBasis(active={self.active}, demand={self.demand}, "
            f"spread_ppm={self.spread_ppm}, even_ppm={self.even_ppm})"
        )


def share_of(total: int, n_live: int) -> int:
    """ceil(total / N_live): a member's part of a limit split across the live fleet."""
    return -(-total // max(1, n_live))


def share_round(amount_ppm: int, coin_ppm: int) -> int:
    """amount_ppm / 1e6 in whole units, rounded up with probability equal to the fraction.

    A worker's part of a small budget is often a fraction of a unit (20 units over 300
    workers); rounding down would starve everyone and rounding up would multiply the
    budget. Rounding at random keeps the fleet's expected total exact. `coin_ppm` is
    uniform in [0, 1e6) and comes from a hash, so runs replay exactly.
    """
    whole, frac = divmod(amount_ppm, PPM)
    return whole + 1 if coin_ppm < frac else whole


def snapshot_allowance_ppm(
    remaining: int, share_ppm: int, active_reporters: int, local_burst_cap: int, need: int = 0
) -> int:
    """What one snapshot row lets its receiver spend, in ppm of a unit: its share of
    `remaining`, capped at b over the active reporters (seed 004), or, for a share above
    the even one (load-balancer skew), at b times twice the share less the even part, and
    never above b (`allowance_cap_ppm`). The owner computes it too, to tell whether a
    refresh would change anything the receiver holds.

    `need`: the largest amount the receiver was denied (the owner does not know it and
    passes 0). While `remaining` holds it, the receiver may hold that much (at most b),
    whatever its share and cap: an amount above an even part of b, or above a share of a
    small bucket, is then served when the bucket could serve it, instead of never fitting.
    Each view still holds at most b, so the fleet runs at most N*b ahead (the envelope)."""
    cap_ppm = allowance_cap_ppm(share_ppm, active_reporters, local_burst_cap)
    portion_ppm = remaining * share_ppm
    if need:
        if need > local_burst_cap:
            need = local_burst_cap
        if need <= remaining and need * PPM > portion_ppm:
            portion_ppm = need * PPM
        if need * PPM > cap_ppm:
            cap_ppm = need * PPM
    return portion_ppm if portion_ppm < cap_ppm else cap_ppm


def allowance_cap_ppm(share_ppm: int, active_reporters: int, local_burst_cap: int) -> int:
    """The most one row lets its receiver hold (ppm of a unit), whatever remains: b / n for
    a share at or below the even one 1/n, and b x (2 x share - 1/n) above it, at most b.

    A cap of b x share (as in older releases) made the caps of all reporters sum to b, so a
    flash crowd on a full bucket of B > b could take at most b a round trip, its busiest
    worker (half the requests, share 0.5) at most b / 2 while the bucket held 80 (flash-crowd:
    the first window's loss). Counting the share's part above the even one twice lets that
    worker hold b; the caps of a key's reporters still sum to at most 3b (b/n each, plus
    2 x b x (share - 1/n) for each share above 1/n), far inside the N x b of the envelope,
    and an even split is capped as before."""
    b_ppm = local_burst_cap * PPM
    even_ppm = b_ppm // active_reporters
    above_ppm = 2 * local_burst_cap * share_ppm - even_ppm
    if above_ppm <= even_ppm:
        return even_ppm
    return above_ppm if above_ppm < b_ppm else b_ppm


def even_part_ppm(remaining: int, burst: int, floor_ppm: int) -> int:
    """The part of `remaining` split evenly, in ppm: as full as the bucket is, and never
    below the configured floor (`CoreConfig.share_floor_ppm`)."""
    even = remaining * PPM // burst
    return even if even > floor_ppm else floor_ppm


def plenty(remaining: int, demand: int, refill: int = 0) -> bool:
    """Whether what remains is plenty for the reporters' recent `demand` (summed), so that
    the bucket's fill, not demand, decides how much of it is split evenly (`share_basis`).
    Not when demand reaches 1/DEMAND_PART of it and OVERLOAD times the `refill` over the
    span it covers (`refill_units`): the bucket is being drained, and its even part is only
    the floor. Monotone in `demand`, so a bound on it that is plenty means plenty."""
    return demand * DEMAND_PART < remaining or demand < OVERLOAD * refill


def refill_units(rate: int, span_ns: int) -> int:
    """Whole units a key's rate refills over `span_ns` (rounded down): what `plenty` holds
    recent demand against, over the span that demand covers."""
    return rate * span_ns // 1_000_000_000 if span_ns > 0 else 0


def share_step(even_ppm: int) -> int:
    """The step of the demand-driven part of a share: 1/2**GRAIN_BITS of the even part each
    reporter gets (at least 1 ppm)."""
    return (even_ppm >> GRAIN_BITS) or 1


def share_basis(
    remaining: int, burst: int, floor_ppm: int, active: int, demand: int, refill: int = 0
) -> ShareBasis:
    """The per-key half of the shares, from the bucket (`remaining` of `burst`), the
    configured floor of the even part, the `active` reporters' summed `demand` and what the
    rate refills over the span it covers: the even part follows the bucket's fill while
    that is `plenty`, and is the floor when not."""
    even = even_part_ppm(remaining if plenty(remaining, demand, refill) else 0, burst, floor_ppm)
    return ShareBasis(active, demand, PPM - even, even // active)


def shares_even(basis: ShareBasis) -> bool:
    """Whether no reporter's demand part reaches a step: every share is the even part."""
    return basis.spread_ppm < share_step(basis.even_ppm)


def share_ppm(basis: ShareBasis, mine: int) -> int:
    """A live reporter's share (ppm) of what remains, given its recent demand `mine`.
    The shares of all active reporters sum to at most `PPM`."""
    even_each = basis.even_ppm
    step = share_step(even_each)
    spread = basis.spread_ppm
    if spread < step:
        return even_each  # shares_even: no reporter's demand part reaches a step
    total = basis.demand
    if total == 0:
        return PPM // basis.active
    by_demand = spread * mine // total
    return by_demand - by_demand % step + even_each


def near(now: int, then: int) -> bool:
    """Whether `now` is within 1/2**NEAR_BITS of `then` (never, while `then` is unset: -1)."""
    d = now - then
    return (d if d >= 0 else -d) << NEAR_BITS <= then


def floor_ppm(share_ppm: int, members: int, demand_ppm: int = PPM) -> int:
    """A member's floor as a part (ppm) of R: the least of its share from the owner's last
    row, the ring's even share 1/members (so the floors of all members sum to at most R
    whatever rows they hold) and its recent demand (`floor_demand_ppm`), so that a member
    that used little is escrowed little while it is silent."""
    part = PPM // max(1, members)
    if share_ppm < part:
        part = share_ppm
    return demand_ppm if demand_ppm < part else part


# A floor follows four times the usage a member reported lately: room for a quiet tenant's
# arrivals to vary, and for the worker's count, over a window some grains shorter than the
# owner's and without the reports a cut left unacknowledged (at 2, quiet tenants kept
# 0.973-0.980 of their ideal through a cut; at 4, more than 0.99: docs/partitions.md).
FLOOR_HEADROOM = 4


def floor_demand_ppm(rate: int, used: int, denied: int, window_ns: int) -> int:
    """FLOOR_HEADROOM times `used` over `window_ns`, as a part (ppm) of `rate` per second
    (at most PPM); 0 when the member was refused at least as much as it admitted (`denied`):
    the key is saturated for it, others take up what it does not spend, and a floor for it
    would only hold back capacity whenever it pauses. Never larger for fewer units used or
    more denied: the worker's counts, at most the owner's used and at least its denied, give
    a part never above the owner's (docs/partitions.md)."""
    if used <= 0 or denied >= used:
        return 0
    part = FLOOR_HEADROOM * used * PPM * 1_000_000_000 // (window_ns * rate)
    return part if part < PPM else PPM


def floor_units(rate: int, elapsed_ns: int, part_ppm: int) -> int:
    """Whole units of a floor (`part_ppm` of R per second) over `elapsed_ns`: what a cut-off
    worker may spend from it over that time, and the escrow its owner charges for it
    (rounded down; the floor's burst covers the fraction, `floor_burst`)."""
    return rate * part_ppm * elapsed_ns // (PPM * 1_000_000_000) if elapsed_ns > 0 else 0


def floor_burst(rate: int, part_ppm: int, lease_ns: int, local_burst_cap: int) -> int:
    """The burst of a worker's floor: what it earns over one reporter lease, at most b and at
    least one unit. The owner's escrow runs from when it last heard from the worker, at least
    `CoreConfig.escrow_after_ns` before the worker's floor opens, and charges at once what
    the burst exceeds that lead, so it has charged the burst before the worker can spend it."""
    burst = floor_units(rate, lease_ns, part_ppm)
    return max(1, min(local_burst_cap, burst))


def floor_start(rate: int, part_ppm: int, lead_ns: int, burst: int) -> int:
    """What a floor holds when it opens: what the owner's escrow has charged by then at the
    floor's rate (it charges from its last word from the worker, at least `lead_ns`
    before), at most the burst. So the floor never spends ahead of the escrow and the
    owner charges nothing at once, which a member that merely paused would cost."""
    held = floor_units(rate, lead_ns, part_ppm)
    return held if held < burst else burst


class UsageWindow:
    """Usage of one key by one member, in grains of time (`CoreConfig.floor_grain_ns`),
    the last `grains` of them: what a floor's demand part is computed from. The owner
    notes each report it applies at its arrival; the worker each report acknowledged, at
    its creation (before it was sent, so before it arrived). Both keep the same grains, so
    the worker can count only what the owner counted (docs/partitions.md)."""

    __slots__ = ("newest", "counts")

    def __init__(self, grains: int) -> None:
        self.newest = -1  # the index (time // grain) of the newest grain counted
        self.counts = [0] * grains  # per grain, at index % grains

    def note(self, grain: int, units: int) -> None:
        """Count `units` in grain number `grain` (grains older than the window are lost)."""
        counts = self.counts
        n = len(counts)
        if grain == self.newest:  # the common case: another report in the same grain
            counts[grain % n] += units
            return
        if grain > self.newest:
            if grain - self.newest >= n:  # every grain kept is out of the window: start anew
                self.counts = counts = [0] * n
            else:
                for g in range(self.newest + 1, grain + 1):
                    counts[g % n] = 0
            self.newest = grain
        elif grain <= self.newest - n:
            return
        counts[grain % n] += units

    def covers(self, first: int) -> bool:
        """Whether every grain from `first` on is still kept (none was dropped)."""
        return first > self.newest - len(self.counts)

    def since(self, first: int) -> int:
        """Units counted in grains `first` to the newest (those still kept)."""
        return self.before(first, self.newest + 1)

    def before(self, first: int, end: int) -> int:
        """Units counted in grains `first` up to, not including, `end` (those still kept)."""
        counts = self.counts
        n = len(counts)
        lo = first if first > self.newest - n + 1 else self.newest - n + 1
        hi = end if end < self.newest + 1 else self.newest + 1
        # The owner asks for the grains before the current one once a grain per reporter and
        # key (`Escrows.promise`): n - 1 of the n kept, whose one left out is at index hi % n
        # (it is grain lo - 1 or grain hi, and lo - 1 = hi - n). Summed without a generator.
        if hi - lo == n - 1:
            return sum(counts) - counts[hi % n]
        if hi - lo >= n:
            return sum(counts)
        return sum(counts[g % n] for g in range(lo, hi))

"""How a limit is divided between workers: every share formula of the mesh, in one place.

Shares are carried in parts per million (ppm) of a unit, so that the owner's arithmetic is
exact integers and a worker's part of a small budget (20 units over 300 workers) is not lost
to rounding. The owner's reply path inlines some of these for speed; a hypothesis test pins
each inlined copy to the function here (tests/mesh/core/test_shares.py).
"""

from __future__ import annotations

__all__ = ["PPM", "share_of", "share_round", "snapshot_allowance_ppm"]

PPM = 1_000_000


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


def snapshot_allowance_ppm(remaining: int, share_ppm: int, active_reporters: int,
                           local_burst_cap: int) -> int:
    """What one snapshot row lets its receiver spend, in ppm of a unit: its share of
    `remaining`, capped at b over the active reporters, or its demand share of b when that
    is larger (load-balancer skew; seed 004). The owner computes it too, to tell whether a
    refresh would change anything the receiver holds."""
    even_ppm = local_burst_cap * PPM // active_reporters
    by_demand_ppm = local_burst_cap * share_ppm
    cap_ppm = even_ppm if even_ppm > by_demand_ppm else by_demand_ppm
    portion_ppm = remaining * share_ppm
    return portion_ppm if portion_ppm < cap_ppm else cap_ppm

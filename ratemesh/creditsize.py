"""How large a worker's credit blocks are and how often it asks, from R, B and the round trip.

The one place the credit sizing formulas live, pure and with no I/O: the worker's holder
(`ratemesh.credit.CreditHolder`) and its loop (`ratemesh.creditloop.CreditLoop`) use them
while they run, `mesh validate` uses them to say when a config cannot serve its bucket
(`strict_findings` in `mesh.config`). None of this bears on safety: a block's size and
when it is asked for only move units between governord's bucket and a worker's hands
(docs/strict.md, "Block size cannot affect safety").

Under sustained overload the bucket is drained at every ask, so a grant is what refilled since
the last one, and what matters is how long the bucket goes unasked. It refills at R up to
``B - outstanding``: once a round of asks is slower than ``(B - outstanding) / R`` the refill
past that cap is lost. So a drained worker waits a quarter of ``B / R`` before it asks again
(`drained_wait_base_ms`), not a fixed time, and asks ahead of need one round trip and a tick
early (`lead_ms`); a block is at most `block_cap` of B, so blocks in hand leave room to
refill.
"""

from __future__ import annotations

__all__ = [
    "DRAINED_WAIT_MAX_MS",
    "DRAINED_WAIT_MIN_MS",
    "LEAD_MIN_MS",
    "LEAD_SLACK_MS",
    "ROUND_TRIP_ASSUMED_MS",
    "UTILISATION_TARGET",
    "block_cap",
    "burst_needed",
    "drained_wait_base_ms",
    "lead_ms",
    "next_round_trip_ms",
    "utilisation_bound",
    "wait_for_target_ms",
]

PPM = 1_000_000
LEAD_MIN_MS = 10  # ask ahead at least this early
LEAD_SLACK_MS = 10  # beyond two round trips: a driver's tick (5 ms) and scheduling
DRAINED_WAIT_MIN_MS = 2  # a drained worker asks no more often than once per this (+ a trip)
DRAINED_WAIT_MAX_MS = 250  # ... and at least this often, however large B / R
DRAINED_WAIT_SHARE = 4  # a drained worker waits B / R over this
ROUND_TRIP_ASSUMED_MS = 10  # before one is measured; `mesh validate`'s nominal round trip
ROUND_TRIP_WEIGHT = 8  # a new round trip moves the estimate by 1/this of the difference
ROUND_TRIP_MAX_MS = 60_000  # a sample past this (a reply after an outage) counts as this
UTILISATION_TARGET = 0.9
BURST_SEARCH_MAX = 10**12  # `burst_needed` gives up past this


def lead_ms(configured: int | None, round_trip_ms: int) -> int:
    """How early to ask ahead of need: ``configured`` if set, else two round trips and a
    tick (`LEAD_SLACK_MS`), at least LEAD_MIN_MS. Two trips: the reply of a reserve sent at
    the low-water mark must land before what is held runs out, with room for one slow trip."""
    if configured is not None:
        return configured
    return max(LEAD_MIN_MS, 2 * round_trip_ms + LEAD_SLACK_MS)


def drained_wait_base_ms(
    configured_lead: int | None,
    rate_per_s: int | None,
    burst: int | None,
) -> int:
    """The wait after the bucket was found drained (spread around this by
    `ratemesh.credit.drained_wait_ms`): ``configured_lead`` if set (the former rule), else
    a quarter of B / R within [DRAINED_WAIT_MIN_MS, DRAINED_WAIT_MAX_MS], so even one worker
    alone asks again before the bucket can refill to its cap; DRAINED_WAIT_MAX_MS while R
    or B is unknown. Not longer for more workers: a wait that grew with the workers a
    partial grant suggested (the square root of them, or all) halved the calls but served
    less of R on a loaded machine (`mesh bench strict`, B / R 50 ms: 0.31-0.86 of R before
    the kill, against 0.73-0.97), where a worker held up leaves the bucket unasked.
    """
    if configured_lead is not None:
        return configured_lead
    if not rate_per_s or not burst:
        return DRAINED_WAIT_MAX_MS
    wait = burst * 1000 // (DRAINED_WAIT_SHARE * rate_per_s)
    return max(DRAINED_WAIT_MIN_MS, min(DRAINED_WAIT_MAX_MS, wait))


def block_cap(burst: int | None, share_ppm: int, block_max: int) -> int:
    """The largest block to ask for: ``block_max``, and ``share_ppm`` of B once B is known
    (at least one unit), so one worker's block never pins the bucket."""
    if burst is None:
        return block_max
    return max(1, min(block_max, burst * share_ppm // PPM))


def next_round_trip_ms(estimate: int | None, sample_ms: int) -> int:
    """The round-trip estimate after one more reply, ``sample_ms`` after its request was
    sent: the first sample as is, then a moving average (1/ROUND_TRIP_WEIGHT per sample),
    samples bounded to [0, ROUND_TRIP_MAX_MS]."""
    sample = max(0, min(ROUND_TRIP_MAX_MS, sample_ms))
    if estimate is None:
        return sample
    return estimate + (sample - estimate) // ROUND_TRIP_WEIGHT


def utilisation_bound(
    rate_per_s: int, burst: int, *, round_trip_ms: int, wait_ms: int, share_ppm: int
) -> float:
    """The share of R a single worker offered more than R is served at least, in steady
    state (more workers asking in turn do better): each round it waits ``wait_ms`` after a
    drained answer and a round trip, and takes what refilled, while up to a block of
    ``share_ppm`` of B in its hands keeps the bucket's cap at ``B - block``."""
    room = burst - burst * share_ppm // PPM
    per_round = rate_per_s * (round_trip_ms + wait_ms) / 1000
    if per_round <= 0:
        return 1.0
    return max(0.0, min(1.0, room / per_round))


def wait_for_target_ms(rate_per_s: int, burst: int, *, round_trip_ms: int, share_ppm: int) -> int:
    """The longest drained wait (a `lead_ms` setting) that keeps `utilisation_bound` at the
    target; 0 if none does."""
    room = burst - burst * share_ppm // PPM
    longest = room * 1000 / (UTILISATION_TARGET * rate_per_s) - round_trip_ms
    return max(0, int(longest))


def burst_needed(rate_per_s: int, *, round_trip_ms: int, share_ppm: int) -> int:
    """The least B (to a doubling, then halved down) for which default settings meet the
    target at ``round_trip_ms``; BURST_SEARCH_MAX if none up to it does."""

    def enough(b: int) -> bool:
        wait = drained_wait_base_ms(None, rate_per_s, b)
        bound = utilisation_bound(
            rate_per_s, b, round_trip_ms=round_trip_ms, wait_ms=wait, share_ppm=share_ppm
        )
        return bound >= UTILISATION_TARGET

    hi = 1
    while not enough(hi):
        if hi >= BURST_SEARCH_MAX:
            return BURST_SEARCH_MAX
        hi *= 2
    lo = hi // 2  # not enough (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi

"""A worker's credit blocks from governord, spent locally with no I/O (the strict mode's hot path).

The driver (the mesh's strict limiter, or ``governor.client``) owns the calls; this object only
decides. It is told when a reserve was *sent* and what came back, and answers ``try_spend``
from what it holds. Times are the caller's monotonic milliseconds, passed in.

Safety is the local expiry and nothing else: a block is spent only while
``now < sent_at + ttl * (1 - 2*rho) - epsilon``, timed from when the request was sent (the
first send, if it was resent with the same request id), never from when the reply arrived.
governord started the block's life after that send and counts it for a full ``ttl`` on its own
clock, so with clocks whose rates differ by at most ``rho`` the worker stops first
(docs/strict.md). Block size, the low-water mark and idle returns only decide how often the
worker calls and how much credit sits unused; they cannot make it spend what it was not given.

With nothing live to spend, the verdict is ``no_credit`` (a reserve is due or in flight) or,
once governord has been unreachable, ``governor_unreachable``: the worker fails closed, never
falls back to a local limit.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ratemesh.checks import check_int
from ratemesh.creditsize import (
    ROUND_TRIP_ASSUMED_MS,
    block_cap,
    next_round_trip_ms,
)
from ratemesh.creditsize import drained_wait_base_ms as sized_drained_wait
from ratemesh.creditsize import lead_ms as sized_lead
from ratemesh.errors import ConfigError

__all__ = [
    "GOVERNOR_UNREACHABLE",
    "NO_CREDIT",
    "PPM",
    "CreditConfig",
    "CreditHolder",
    "DENIED_BACKOFF_MAX_MS",
    "DENIED_BACKOFF_MIN_MS",
    "HeldBlock",
    "Reserve",
    "Spend",
    "denied_backoff_ms",
    "drained_wait_ms",
    "local_expiry_ms",
    "node_burst",
    "node_rate",
    "rate_burst",
]

PPM = 1_000_000
DEMAND_SAMPLES_RATE = 4  # demand samples (milliseconds with wants) that make a rate
# After governord said no for another reason than an empty bucket (a cap, too many blocks):
# wait this long before asking again, doubling to the maximum, so it is not hammered.
DENIED_BACKOFF_MIN_MS = 10
DENIED_BACKOFF_MAX_MS = 500
NO_CREDIT = "no_credit"
GOVERNOR_UNREACHABLE = "governor_unreachable"


def local_expiry_ms(sent_at_ms: int, ttl_ms: int, rho_ppm: int, epsilon_ms: int) -> int:
    """The last local instant (exclusive) a block may be spent: ``sent_at + ttl*(1 - 2*rho)
    - epsilon``, rounded towards the earlier side. The one place this formula lives."""
    return sent_at_ms + ttl_ms * (PPM - 2 * rho_ppm) // PPM - epsilon_ms


def denied_backoff_ms(previous_ms: int) -> int:
    """The wait after a denial that is not an empty bucket's, from the one before it (0 at
    first): DENIED_BACKOFF_MIN_MS doubling to DENIED_BACKOFF_MAX_MS. An empty bucket's
    denial waits ``lead_ms`` instead, as a partial grant does (`CreditHolder.failed`)."""
    return min(DENIED_BACKOFF_MAX_MS, max(DENIED_BACKOFF_MIN_MS, previous_ms * 2))


def drained_wait_ms(lead_ms: int, instant: int) -> int:
    """The wait before asking again once the bucket was found drained (a partial grant, or
    an empty bucket's denial): ``lead_ms``, spread over [lead_ms/2, 3*lead_ms/2) by a hash
    of ``instant`` (the clock's reading, in any unit). A fixed wait keeps workers that were
    refused together in step, so the same one asks first after each refill and takes it all
    every time; the spread changes the order each round. A hash, not `random`: the cores
    stay deterministic for the simulator, and real clock readings spread it anyway."""
    spread = (instant * 0x9E3779B1 >> 7) % max(1, lead_ms)
    return lead_ms // 2 + spread


def node_rate(node: object, resource: str) -> int | None:
    """The rate R (per second) of ``resource`` on a node as governord's GetNode shows it,
    or None if it has none there."""
    return _node_rate_part(node, resource, 0)


def _node_rate_part(node: object, resource: str, part: int) -> int | None:
    """Part ``part`` (0: per_s, 1: burst) of ``resource``'s rate in a GetNode answer
    (``{"rates": {resource: [per_s, burst]}}``), if it is a positive integer."""
    rates = node.get("rates") if isinstance(node, dict) else None
    rate = rates.get(resource) if isinstance(rates, dict) else None
    if not isinstance(rate, list | tuple) or len(rate) != 2:
        return None
    value = rate[part]
    return value if type(value) is int and value > 0 else None


def rate_burst(denial: object) -> int | None:
    """The bucket's burst B that a rate denial from governord states (``{"reason": "rate",
    "limit": B, ...}``, the wire's denial detail), or None for any other denial."""
    if not isinstance(denial, dict) or denial.get("reason") != "rate":
        return None
    limit = denial.get("limit")
    return limit if type(limit) is int and limit > 0 else None


def node_burst(node: object, resource: str) -> int | None:
    """The burst B of ``resource``'s rate on a node as governord's GetNode shows it
    (``{"rates": {resource: [per_s, burst]}}``), or None if it has none there."""
    return _node_rate_part(node, resource, 1)


@dataclass(frozen=True, slots=True)
class CreditConfig:
    """The worker's knobs. Only ``rho_ppm`` and ``epsilon_ms`` bear on safety; the rest tune
    round trips per admitted unit against credit left stranded in idle workers."""

    rho_ppm: int = 1_000  # clock-rate drift tolerated between worker and governord (0.1 %)
    epsilon_ms: int = 50  # slack for a spend decided just before the deadline
    block_min: int = 1
    block_max: int = 100_000
    horizon_ms: int = 1_000  # a block covers about this long of recent demand
    # ... and is at most this share of its bucket's burst B, once governord has stated B
    # (an empty bucket's denial carries it): several workers then share a small bucket
    burst_share_ppm: int = 250_000
    # refill while what is held would last at least this long; None: derived from the
    # measured round trip, and a drained worker's wait from R and B (ratemesh.creditsize)
    lead_ms: int | None = None
    idle_ms: int = 2_000  # return what is held after this long with no demand
    demand_window_ms: int = 5_000
    demand_samples_max: int = 1_024
    blocks_max: int = 64  # blocks held at once (governord bounds a session's too)
    unreachable_after_ms: int = 1_000  # a reserve unanswered this long: governord unreachable

    def __post_init__(self) -> None:
        check_int("rho_ppm", self.rho_ppm, maximum=PPM // 4)
        check_int("epsilon_ms", self.epsilon_ms)
        check_int("block_min", self.block_min, minimum=1)
        check_int("block_max", self.block_max, minimum=self.block_min)
        if self.lead_ms is not None:
            check_int("lead_ms", self.lead_ms, minimum=1)
        for name in (
            "horizon_ms",
            "idle_ms",
            "demand_window_ms",
            "unreachable_after_ms",
        ):
            check_int(name, getattr(self, name), minimum=1)
        check_int("burst_share_ppm", self.burst_share_ppm, minimum=1, maximum=PPM)
        check_int("demand_samples_max", self.demand_samples_max, minimum=1)
        check_int("blocks_max", self.blocks_max, minimum=1)


@dataclass(frozen=True, slots=True)
class Reserve:
    """A reserve the driver is about to send: ask for ``units``; ``sent_at_ms`` times it."""

    sent_at_ms: int
    units: int


@dataclass(slots=True)
class HeldBlock:
    block_id: int
    units: int  # as granted
    left: int  # not spent yet
    expires_at_ms: int  # local: spent only while now < this


@dataclass(frozen=True, slots=True)
class Spend:
    """A verdict. ``taken`` is (block id, units) per block spent from, for the record."""

    admitted: bool
    units: int
    reason: str | None = None
    taken: tuple[tuple[int, int], ...] = ()


class CreditHolder:
    """The blocks one worker holds for one (node, resource)."""

    def __init__(self, config: CreditConfig | None = None) -> None:
        self.config = config or CreditConfig()
        self.blocks: dict[int, HeldBlock] = {}
        self.in_flight: Reserve | None = None
        self.unreachable = False
        self.burst: int | None = None  # the bucket's B, once governord stated it
        self.rate: int | None = None  # the bucket's R per second, once governord stated it
        self.round_trip_ms: int | None = None  # a moving average of reserves' round trips
        self._now_ms = -(2**62)
        self._demand: deque[tuple[int, int]] = deque(maxlen=self.config.demand_samples_max)
        self._last_want_ms: int | None = None
        self._late: list[tuple[int, int]] = []  # granted after its local expiry: return whole
        # The hot path's shortcut, set by a full `try_spend` and dropped by anything else that
        # moves time or the blocks: the block a spend takes from first while it has units,
        # the earliest local expiry of any block held, and the verdict last given from it.
        self._head: HeldBlock | None = None
        self._head_until_ms = -(2**62)
        self._head_spend: Spend | None = None

    # ---- time ----------------------------------------------------------------------------

    def _at(self, now_ms: int) -> int:
        check_int("now_ms", now_ms, minimum=-(2**62))
        if now_ms < self._now_ms:
            raise ConfigError(
                "now_ms", f"a monotonic clock never goes back: {now_ms} < {self._now_ms}"
            )
        self._now_ms = now_ms
        self._head = None
        for block_id in [b.block_id for b in self.blocks.values() if now_ms >= b.expires_at_ms]:
            del self.blocks[block_id]  # a reference kept elsewhere is past its `until` too
        return now_ms

    def held(self, now_ms: int) -> int:
        """Units that may still be spent at ``now_ms``."""
        self._at(now_ms)
        return sum(b.left for b in self.blocks.values())

    # ---- the hot path --------------------------------------------------------------------

    def try_spend(self, now_ms: int, units: int = 1) -> Spend:
        """Admit ``units`` from live blocks (earliest expiry first), all or nothing; no I/O.

        The common case, where the block a full spend would take from first still has the
        units and no block held has reached its local expiry, is one step (the same answer)."""
        head = self._head
        if (
            head is not None
            and units.__class__ is int
            and now_ms.__class__ is int
            and self._now_ms <= now_ms < self._head_until_ms
            and 0 < units <= head.left
        ):
            self._now_ms = now_ms
            head.left -= units
            self._last_want_ms = now_ms
            demand = self._demand  # `_want`, inline: a full spend left a sample in it
            last = demand[-1]
            if last[0] == now_ms:
                demand[-1] = (now_ms, last[1] + units)
            else:
                demand.append((now_ms, units))
            spend = self._head_spend
            if spend is None or spend.units != units:
                spend = self._head_spend = Spend(True, units, None, ((head.block_id, units),))
            return spend
        check_int("units", units, minimum=1)
        now = self._at(now_ms)
        self._want(now, units)
        live = sorted(self.blocks.values(), key=lambda b: (b.expires_at_ms, b.block_id))
        if sum(b.left for b in live) < units:
            return Spend(False, units, self.why_not(now))
        need, taken = units, []
        for block in live:
            take = min(need, block.left)
            if take:
                block.left -= take
                need -= take
                taken.append((block.block_id, take))
            if need == 0:
                break
        # the next spend takes first from the first block with units (spent-out ones before
        # it give nothing), while no block held reaches its local expiry
        head = next((b for b in live if b.left), None)
        if head is not None:
            self._head, self._head_until_ms, self._head_spend = head, live[0].expires_at_ms, None
        return Spend(True, units, None, tuple(taken))

    def why_not(self, now: int) -> str:
        """What a spend denied at ``now`` says: ``governor_unreachable`` once a reserve failed
        to reach governord, or one has gone unanswered for ``unreachable_after_ms``; else
        ``no_credit`` (a reserve is due). Moves no time: a driver may ask it of a waiter."""
        request = self.in_flight
        waited = (
            request is not None and now - request.sent_at_ms >= self.config.unreachable_after_ms
        )
        return GOVERNOR_UNREACHABLE if self.unreachable or waited else NO_CREDIT

    # ---- reserving -----------------------------------------------------------------------

    def demand_per_s(self, now_ms: int) -> float:
        """Units wanted per second (recent spends and denials) over the demand window, or
        over the time the samples cover once there are DEMAND_SAMPLES_RATE of them (one per
        millisecond with wants) and they span less: their bound, or demand that began less
        than a window ago, so a tight loop is read at its rate within milliseconds while a
        few first wants are not read as a rate."""
        self._at(now_ms)
        self._trim(now_ms)
        demand = self._demand
        if not demand:
            return 0.0
        cfg = self.config
        window = cfg.demand_window_ms
        if len(demand) >= min(DEMAND_SAMPLES_RATE, cfg.demand_samples_max):
            window = min(window, now_ms - demand[0][0] + 1)
        return sum(n for _, n in demand) * 1000 / window

    def block_size(self, now_ms: int) -> int:
        """About ``horizon_ms`` of recent demand, within [block_min, block_max], and at most
        ``burst_share_ppm`` of the bucket's burst once it is known: a block counts whole
        against B until it is spent out, so one worker's block must not pin the bucket."""
        cfg = self.config
        want = math.ceil(self.demand_per_s(now_ms) * cfg.horizon_ms / 1000)
        top = block_cap(self.burst, cfg.burst_share_ppm, cfg.block_max)
        return max(cfg.block_min, min(top, want))

    def lead_ms(self) -> int:
        """How early to ask ahead (`ratemesh.creditsize.lead_ms`): the configured lead, else
        from the measured round trip."""
        trip = ROUND_TRIP_ASSUMED_MS if self.round_trip_ms is None else self.round_trip_ms
        return sized_lead(self.config.lead_ms, trip)

    def drained_wait_base_ms(self) -> int:
        """The wait after the bucket was found drained, before its spread
        (`ratemesh.creditsize.drained_wait_base_ms`): from R and B once both are known."""
        return sized_drained_wait(self.config.lead_ms, self.rate, self.burst)

    def low_water(self, now_ms: int) -> int:
        """Refill once what is held (and lasts past the lead) drops to this."""
        return math.ceil(self.demand_per_s(now_ms) * self.lead_ms() / 1000)

    def refill(self, now_ms: int, *, ahead: bool = False) -> Reserve | None:
        """A reserve to send now, or None: one at a time, only while there is demand, when
        what will still be spendable ``lead_ms`` from now is at or below the low-water mark.

        ``ahead``: no admission is waiting for it (a driver's tick), so only while the
        holder expects a unit of demand before ``idle_ms`` would give it back. The
        low-water mark is rounded up to a unit, so a key used once every few seconds would
        otherwise keep asking ahead for a unit it does not use and hold it until
        ``idle_ms``; a tenant thin on many workers would pin its whole bucket that way (the
        simulator's `scale`). Such a key asks when an admission needs credit (`begin`)."""
        now = self._at(now_ms)
        cfg = self.config
        if self.in_flight is not None or len(self.blocks) >= cfg.blocks_max:
            return None
        if self._last_want_ms is None or now - self._last_want_ms >= cfg.idle_ms:
            return None
        if ahead and self.demand_per_s(now) * cfg.idle_ms < 1000:
            return None
        lead = self.lead_ms()
        lasting = sum(b.left for b in self.blocks.values() if b.expires_at_ms > now + lead)
        if lasting > self.low_water(now):
            return None
        self.in_flight = Reserve(now, self.block_size(now))
        return self.in_flight

    def begin(self, now_ms: int, units: int) -> Reserve | None:
        """Start a reserve of the driver's own size (a known burst ahead, say); None while
        one is in flight or the holder is full."""
        check_int("units", units, minimum=1)
        now = self._at(now_ms)
        if self.in_flight is not None or len(self.blocks) >= self.config.blocks_max:
            return None
        self.in_flight = Reserve(now, units)
        return self.in_flight

    def granted(
        self, now_ms: int, request: Reserve, block_id: int, units: int, ttl_ms: int
    ) -> HeldBlock:
        """The reply to ``request``, arrived at ``now_ms``: hold the block until its local
        expiry, which is timed from the request's send, not from now."""
        check_int("block_id", block_id, minimum=1)
        check_int("units", units, minimum=1)
        check_int("ttl_ms", ttl_ms, minimum=1)
        if block_id in self.blocks:
            raise ConfigError("block_id", f"block {block_id} is already held")
        now = self._at(now_ms)
        cfg = self.config
        self.round_trip_ms = next_round_trip_ms(self.round_trip_ms, now - request.sent_at_ms)
        expires = local_expiry_ms(request.sent_at_ms, ttl_ms, cfg.rho_ppm, cfg.epsilon_ms)
        block = HeldBlock(block_id, units, units, expires)
        if expires > now:
            self.blocks[block_id] = block
        elif len(self._late) < cfg.blocks_max:
            self._late.append((block_id, units))  # never spendable; governord may reuse it
        self._settle(request)
        self.unreachable = False
        return block

    def failed(self, request: Reserve, *, unreachable: bool, burst: int | None = None) -> None:
        """The reserve came back denied (``unreachable=False``) or not at all. ``burst``:
        the denial was an empty bucket's and stated its B (`rate_burst`), which bounds the
        blocks asked from then on (`block_size`)."""
        if burst is not None:
            self.learn_burst(burst)
        self._settle(request)
        if unreachable:
            self.unreachable = True

    def learn_burst(self, burst: int, per_s: int | None = None) -> None:
        """governord stated a burst B on this credit's chain (the node's rate, or an empty
        bucket's denial), and with the node's rate its R (``per_s``): blocks are sized
        within a share of the smallest B told, and a drained wait from R and B."""
        check_int("burst", burst, minimum=1)
        self.burst = burst if self.burst is None else min(self.burst, burst)
        if per_s is not None:
            check_int("per_s", per_s, minimum=1)
            self.rate = per_s if self.rate is None else min(self.rate, per_s)

    def _settle(self, request: Reserve) -> None:
        if self.in_flight is request:
            self.in_flight = None

    # ---- returning -----------------------------------------------------------------------

    def take_returns(self, now_ms: int, *, leaving: bool = False) -> list[tuple[int, int]]:
        """(block id, unused units) to return, removed from the holder first so they are
        never spent after the return is sent: spent-out blocks always (governord then stops
        counting them at once), everything when idle for ``idle_ms`` or ``leaving``."""
        now = self._at(now_ms)
        idle = self._last_want_ms is None or now - self._last_want_ms >= self.config.idle_ms
        out, self._late = self._late, []
        for block_id in sorted(self.blocks):
            block = self.blocks[block_id]
            if block.left == 0 or idle or leaving:
                out.append((block_id, block.left))
                del self.blocks[block_id]
                block.left = 0  # returned: a reference kept elsewhere (a gate's) spends nothing
        return out

    # ---- demand --------------------------------------------------------------------------

    def _want(self, now_ms: int, units: int) -> None:
        """Demand of ``units`` at ``now_ms``: one sample per millisecond (wants in the same
        millisecond add up), so the bounded samples span at least ``demand_samples_max`` ms."""
        self._last_want_ms = now_ms
        demand = self._demand
        if demand and demand[-1][0] == now_ms:
            demand[-1] = (now_ms, demand[-1][1] + units)
        else:
            demand.append((now_ms, units))

    def spent(self, at_ms: int, units: int) -> None:
        """``units`` the caller spent at ``at_ms`` from the block `fast_block` named, by itself
        (the mesh's strict gate, on its hot path): counted as demand as a spend here is. The
        caller tells them in time order, before anything else that reads demand."""
        self._want(at_ms, units)

    def fast_block(self) -> tuple[HeldBlock | None, int]:
        """The block the next spend takes from first, and the local instant (exclusive) until
        which it does: the earliest local expiry of any block held, never later than its own.
        Set by a full `try_spend` that admitted; (None, -2**62) once anything else has moved
        time or the blocks. A caller that spends from it by itself (`block.left -= units`,
        while ``now < until`` and ``units <= block.left``, then `spent`) gives the answers
        `try_spend` would; a block the holder returns has ``left`` set to 0, one it drops
        at its local expiry is past ``until``."""
        if self._head is None:
            return None, -(2**62)
        return self._head, self._head_until_ms

    def _trim(self, now_ms: int) -> None:
        horizon = now_ms - self.config.demand_window_ms
        while self._demand and self._demand[0][0] <= horizon:
            self._demand.popleft()

"""One interface for every strategy the simulator compares, and what they share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mesh.core.policy import DEFAULT_TENANT, Mode, PolicyCache, TenantRatePolicy
from sim.network import ScenarioNetwork
from sim.scenario import Policy, Scenario
from sim.workload import Arrival, TenantInfo

__all__ = ["Context", "Resolved", "Strategy", "next_generation", "policies_for", "to_policy"]

# (arrival, admitted, t_ns): the verdict on an arrival that waited, given at t_ns
Resolved = Callable[[Arrival, bool, int], None]


@dataclass
class Context:
    scenario: Scenario
    seed: int
    workers: list[str]
    tenants: dict[str, TenantInfo]
    network: ScenarioNetwork


def to_policy(tenant: str, p: Policy, mode: Mode, generation: int = 1) -> TenantRatePolicy:
    return TenantRatePolicy(
        tenant, p.metric, generation, p.rate, p.burst, p.local_burst_cap, True, mode, p.metric_unit
    )


def policies_for(ctx: Context, mode: Mode) -> PolicyCache:
    """Explicit tenants get their own policy; group tenants share the default (tenant '*'),
    each still metered under its own key."""
    sc = ctx.scenario
    pols = [to_policy(DEFAULT_TENANT, sc.policy, mode)]
    pols += [to_policy(t.name, t.policy or sc.policy, mode) for t in sc.tenants]
    return PolicyCache(pols)


class Strategy(ABC):
    """A way of limiting a fleet, driven step by step on the simulator's clock."""

    name = "?"
    round_trips_per_admit = 0
    # judged by `admitted <= R*T + B` over every interval of what the runner recorded
    # (sim.measure.envelope_summary), not by the lead over the ideal
    judged_over_intervals = False

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.messages = 0  # peer messages sent (not counting a member's calls to itself)
        self.round_trips = 0  # network round trips on the hot path
        self.live: list[str] = list(ctx.workers)
        self.generations: dict[str, int] = {}
        self.resolved: Resolved = _unexpected  # the runner's; see `admit`

    @abstractmethod
    def advance(self, t_ns: int) -> None:
        """Run the strategy's own events (ticks, messages) up to t_ns."""

    @abstractmethod
    def admit(self, a: Arrival, now_ns: int) -> bool | None:
        """The hot-path decision for one arrival at its worker. None: it waits (as a node's
        `admit()` with a deadline does), and the strategy calls `self.resolved(a, admitted,
        t_ns)` once with its verdict, by its deadline, from `advance`."""

    def wait_helps(self, a: Arrival, now_ns: int) -> bool | None:
        """Of the denial `admit` just gave `a`: may waiting help (a later ask be admitted)?
        None: the strategy's answer does not say."""
        return None

    def refund(self, a: Arrival, now_ns: int) -> None:  # noqa: B027 (optional hook)
        """A short send gives back `a.refund` (byte metrics)."""

    def crash(self, worker: str, now_ns: int) -> None:
        self.live.remove(worker)

    def restart(self, worker: str, now_ns: int) -> None:
        self.live.append(worker)
        self.live.sort()

    def join(self, worker: str, now_ns: int) -> None:
        self.restart(worker, now_ns)

    def leave(self, worker: str, now_ns: int) -> None:
        self.crash(worker, now_ns)

    def skew(self, worker: str, offset_ns: int) -> None:  # noqa: B027
        """Clock skew matters only to strategies that trust members' clocks."""

    def partition_changed(self, now_ns: int) -> None:  # noqa: B027
        """The network's partitions changed (strategies that watch membership react)."""

    def policy_changed(self, tenant: str, p: Policy, now_ns: int) -> None:  # noqa: B027
        """A new policy generation for `tenant`, seen by every member."""

    def governor_crash(self, now_ns: int) -> None:  # noqa: B027
        """governord stops answering (only the strict strategy talks to it)."""

    def governor_restart(self, now_ns: int) -> None:  # noqa: B027
        """governord is back, rebuilt from its durable events."""

    def report(self) -> dict[str, Any]:
        """Figures of the strategy's own to add to the recorder's summary."""
        return {}

    def message_count(self) -> int:
        return self.messages

    def measured_d_ns(self) -> int | None:
        """The propagation delay d this run measured, if the strategy has one."""
        return None

    def owner_of(self, tenant: str, metric: str) -> str | None:
        return None


def _unexpected(a: Arrival, admitted: bool, t_ns: int) -> None:
    raise AssertionError(f"{a} was resolved, but no runner is waiting for it")


def next_generation(s: Strategy, tenant: str) -> int:
    s.generations[tenant] = s.generations.get(tenant, 1) + 1
    return s.generations[tenant]

"""`central-open` / `central-closed`: one exact counter reached with a round trip per
request, like a Redis-backed limiter. Exact while reachable; during an outage (or when the
request or its answer is lost) it fails open (admit) or closed (deny)."""

from __future__ import annotations

from mesh.core.gcra import Gcra
from sim.scenario import Policy
from sim.strategies.base import Context, Strategy
from sim.workload import Arrival

__all__ = ["CentralStrategy", "CENTRAL"]

CENTRAL = "central"


class CentralStrategy(Strategy):
    round_trips_per_admit = 1

    def __init__(self, ctx: Context, *, fail_open: bool) -> None:
        super().__init__(ctx)
        self.fail_open = fail_open
        self.name = "central-open" if fail_open else "central-closed"
        self.meters: dict[str, Gcra] = {}
        self.policy: dict[str, Policy] = {t: i.policy for t, i in ctx.tenants.items()}
        self.failed = 0

    def advance(self, t_ns: int) -> None:
        pass

    def _meter(self, tenant: str, now_ns: int) -> Gcra:
        m = self.meters.get(tenant)
        if m is None:
            p = self.policy[tenant]
            m = self.meters[tenant] = Gcra(p.rate, p.burst, now_ns)
        return m

    def admit(self, a: Arrival, now_ns: int) -> bool:
        net = self.ctx.network
        self.round_trips += 1
        self.messages += 1
        there = net.transit(a.worker, CENTRAL, now_ns)
        if not there:
            self.failed += 1
            return self.fail_open
        arrive = now_ns + there[0]
        verdict = self._meter(a.tenant, arrive).try_take(arrive, a.amount)
        self.messages += 1
        if not net.transit(CENTRAL, a.worker, arrive):
            self.failed += 1  # the answer was lost: the caller times out
            return self.fail_open
        return verdict

    def refund(self, a: Arrival, now_ns: int) -> None:
        self.round_trips += 1
        self.messages += 1
        if self.ctx.network.transit(a.worker, CENTRAL, now_ns):
            self._meter(a.tenant, now_ns).apply(now_ns, -a.refund)

    def policy_changed(self, tenant: str, p: Policy, now_ns: int) -> None:
        self.policy[tenant] = p
        if tenant in self.meters:
            self.meters[tenant].retune(p.rate, p.burst, now_ns)

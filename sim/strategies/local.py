"""`local` (every worker enforces the whole limit alone) and `share` (ceil(limit / N_live)):
the real Admission in its local and share modes, one per worker."""

from __future__ import annotations

from mesh.core.admission import Admission
from mesh.core.config import CoreConfig
from mesh.core.policy import Mode, PolicyCache
from mesh.core.verdict import Verdict
from sim.scenario import Policy
from sim.strategies.base import Context, Strategy, next_generation, policies_for, to_policy
from sim.workload import Arrival

__all__ = ["LocalStrategy", "ShareStrategy"]


class LocalStrategy(Strategy):
    name = "local"
    mode = Mode.LOCAL

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.config: CoreConfig = ctx.scenario.core_config()
        self.policies: PolicyCache = policies_for(ctx, self.mode)
        self.adm = {w: self._admission(0) for w in ctx.workers}
        self.next_tick = 0
        self.last: Verdict | None = None  # the verdict `admit` gave last (`wait_helps`)

    def _admission(self, now_ns: int) -> Admission:
        return Admission(self.policies, now_ns, config=self.config, n_live=len(self.live))

    def advance(self, t_ns: int) -> None:
        step = self.config.sync_interval_ns
        while self.next_tick <= t_ns:
            for w in self.live:
                self.adm[w].tick(self.next_tick)
            self.next_tick += step

    def admit(self, a: Arrival, now_ns: int) -> bool:
        v = self.adm[a.worker].try_admit(a.tenant, a.metric, a.amount)
        self.last = v
        return v.allowed

    def wait_helps(self, a: Arrival, now_ns: int) -> bool | None:
        if self.last is None:
            return None
        detailed = self.adm[a.worker].detail(self.last, a.tenant, a.metric, a.amount)
        return detailed.retry_after_ms is not None

    def refund(self, a: Arrival, now_ns: int) -> None:
        self.adm[a.worker].refund(a.tenant, a.metric, a.refund)

    def restart(self, worker: str, now_ns: int) -> None:
        super().restart(worker, now_ns)
        self.adm[worker] = self._admission(now_ns)  # a new process starts with full buckets

    def policy_changed(self, tenant: str, p: Policy, now_ns: int) -> None:
        self.policies.put(to_policy(tenant, p, self.mode, next_generation(self, tenant)))


class ShareStrategy(LocalStrategy):
    name = "share"
    mode = Mode.SHARE

    def _membership(self, now_ns: int) -> None:
        isolated = self._isolated()
        for w in self.live:
            self.adm[w].membership(len(self.live), w in isolated, now_ns)

    def _isolated(self) -> set[str]:
        """Members cut off from the rest see their membership source go stale."""
        net = self.ctx.network
        out: set[str] = set()
        for p in net.partitions:
            inside = [w for w in self.live if w in p]
            if len(inside) < len(self.live) / 2:
                out.update(inside)
        return out

    def crash(self, worker: str, now_ns: int) -> None:
        super().crash(worker, now_ns)
        self._membership(now_ns)

    def restart(self, worker: str, now_ns: int) -> None:
        super().restart(worker, now_ns)
        self._membership(now_ns)

    def partition_changed(self, now_ns: int) -> None:
        self._membership(now_ns)

"""What a run is judged by, recorded outside the system from what it admitted.

The ideal is one exact GCRA per key that sees every request in arrival order. Per key we
keep cumulative admitted and ideal units; their difference, sampled every step, is the
excess (the strategy ahead of the ideal). The shortfall is under-service: in each 100 ms
window, what the ideal admitted beyond what the strategy did. (Matching request by request
would be wrong: under overload, admitting a different request of the same tenant at the
same moment serves the tenant just as well.)
"""

from __future__ import annotations

from typing import Any

from mesh.core.gcra import NS_PER_S, Gcra
from ratemesh.envelope import excess_over_times
from sim.scenario import Policy
from sim.workload import Arrival, TenantInfo

__all__ = ["KeyRecord", "Recorder", "envelope_summary", "jain"]

WINDOW_NS = 100_000_000  # plot resolution: admitted rate per 100 ms


class KeyRecord:
    __slots__ = (
        "tenant",
        "policy",
        "ideal_meter",
        "admitted",
        "ideal",
        "offered",
        "shortfall",
        "max_excess",
        "excess_sum",
        "last_excess",
        "last_step",
        "window",
        "iwindow",
        "win_idx",
        "series",
        "workers",
        "quiet",
        "max_rate",
        "max_b",
        "max_burst",
    )

    def __init__(self, info: TenantInfo, now_ns: int) -> None:
        self.tenant = info.name
        self.quiet = info.quiet
        self.policy = info.policy
        self.ideal_meter = Gcra(info.policy.rate, info.policy.burst, now_ns)
        self.admitted = 0
        self.ideal = 0
        self.offered = 0
        self.shortfall = 0
        self.max_excess = 0
        self.excess_sum = 0
        self.last_excess = 0  # excess at the last step this key moved
        self.last_step = 0
        self.window = 0  # admitted in the current 100 ms window
        self.iwindow = 0  # what the ideal admitted in it
        self.win_idx = 0
        self.series: list[int] = []
        self.workers: set[str] = set()
        self.max_rate = info.policy.rate
        self.max_b = info.policy.local_burst_cap
        self.max_burst = info.policy.burst

    def change_policy(self, policy: Policy, now_ns: int) -> None:
        self.policy = policy
        self.ideal_meter.retune(policy.rate, policy.burst, now_ns)
        self.max_rate = max(self.max_rate, policy.rate)
        self.max_b = max(self.max_b, policy.local_burst_cap)
        self.max_burst = max(self.max_burst, policy.burst)


class Recorder:
    def __init__(
        self, tenants: dict[str, TenantInfo], start_ns: int, *, keep_admissions: bool = False
    ) -> None:
        self.tenants = tenants
        # tenant -> (t_ns, units) per admission, for strategies judged over every interval
        # (bounded by the run; kept only when asked)
        self.admissions: dict[str, list[tuple[int, int]]] | None = {} if keep_admissions else None
        self.start_ns = start_ns
        self.keys: dict[str, KeyRecord] = {}
        self.requests = 0
        self.steps = 0

    def key(self, tenant: str, now_ns: int) -> KeyRecord:
        k = self.keys.get(tenant)
        if k is None:
            k = self.keys[tenant] = KeyRecord(self.tenants[tenant], now_ns)
        return k

    def _roll(self, k: KeyRecord, idx: int) -> None:
        """Close k's window(s) up to index idx: record the rate, count any under-service."""
        if idx == k.win_idx:
            return
        k.series.append(k.window)
        k.series.extend([0] * (idx - k.win_idx - 1))
        if k.iwindow > k.window:
            k.shortfall += k.iwindow - k.window
        k.window, k.iwindow, k.win_idx = 0, 0, idx

    def record(self, a: Arrival, allowed: bool, now_ns: int) -> KeyRecord:
        """An arrival decided on the spot: offered, and admitted if `allowed`."""
        k = self.offer(a, now_ns)
        if allowed:
            self._admitted(k, a, now_ns)
        return k

    def offer(self, a: Arrival, now_ns: int) -> KeyRecord:
        """An arrival offered at `now_ns`: the ideal sees it now, whenever it is decided."""
        k = self.key(a.tenant, now_ns)
        self._roll(k, (now_ns - self.start_ns) // WINDOW_NS)
        self.requests += 1
        k.offered += a.amount
        k.workers.add(a.worker)
        used = a.amount - a.refund
        if k.ideal_meter.try_take(now_ns, a.amount):
            k.ideal += used
            k.iwindow += used
            if a.refund:
                k.ideal_meter.apply(now_ns, -a.refund)
        return k

    def admit(self, a: Arrival, now_ns: int) -> KeyRecord:
        """An arrival offered earlier (`offer`) and admitted at `now_ns`, after it waited:
        counted, and judged over intervals, at the instant it was admitted."""
        k = self.keys[a.tenant]
        self._roll(k, (now_ns - self.start_ns) // WINDOW_NS)
        self._admitted(k, a, now_ns)
        return k

    def _admitted(self, k: KeyRecord, a: Arrival, now_ns: int) -> None:
        used = a.amount - a.refund
        k.admitted += used
        k.window += used
        if self.admissions is not None and used > 0:
            self.admissions.setdefault(a.tenant, []).append((now_ns, used))

    def sample(self, step: int, touched: set[str]) -> None:
        """After step number `step`: the excess of every key that moved.

        A key that did not move keeps its excess, so the time-average is accumulated
        lazily (excess x steps it lasted) instead of visiting every key every step.
        """
        for tenant in touched:
            k = self.keys[tenant]
            k.excess_sum += k.last_excess * (step - k.last_step)
            e = k.admitted - k.ideal
            k.last_excess = e if e > 0 else 0
            k.last_step = step
            if e > k.max_excess:
                k.max_excess = e

    def finish(self, steps: int, end_ns: int) -> None:
        idx = (end_ns - self.start_ns + WINDOW_NS - 1) // WINDOW_NS
        for k in self.keys.values():
            k.excess_sum += k.last_excess * (steps - k.last_step)
            k.last_step = steps
            self._roll(k, idx)
        self.steps = steps

    def envelope(self) -> dict[str, Any]:
        """The strict figures from what this recorder saw admitted (`envelope_summary`)."""
        assert self.admissions is not None, "a Recorder(keep_admissions=True) only"
        limits = {t: (k.max_rate, k.max_burst) for t, k in self.keys.items()}
        return envelope_summary(self.admissions, limits)

    def summary(self, *, d_ns: int, n_default: int) -> dict[str, Any]:
        """Per-strategy figures, aggregated over keys (the worst key where a max is due)."""
        keys = list(self.keys.values())
        admitted = sum(k.admitted for k in keys)
        ideal = sum(k.ideal for k in keys)
        shortfall = sum(k.shortfall for k in keys)
        worst_ratio, worst = -1.0, None
        within = True
        mean_pct = []
        bound_by_key: dict[str, float] = {}
        for k in keys:
            n = max(len(k.workers), 1) if k.workers else n_default
            bound = n * k.max_b + k.max_rate * d_ns / NS_PER_S
            bound_by_key[k.tenant] = bound
            within &= k.max_excess <= bound
            ratio = k.max_excess / bound if bound else 0.0
            if ratio > worst_ratio:
                worst_ratio, worst = ratio, k
            mean = k.excess_sum / max(self.steps, 1)
            mean_pct.append(100.0 * mean / k.max_rate)
        shares = [min(1.0, k.admitted / k.ideal) for k in keys if k.ideal > 0]
        quiet = [k for k in keys if k.quiet]
        q_ideal = sum(k.ideal for k in quiet)
        return {
            "admitted": admitted,
            "ideal": ideal,
            "max_excess": worst.max_excess if worst else 0,
            "max_excess_tenant": worst.tenant if worst else None,
            "mean_excess": round(
                sum(k.excess_sum for k in keys) / max(self.steps, 1) / max(len(keys), 1), 3
            ),
            "mean_excess_pct_of_rate": round(sum(mean_pct) / max(len(mean_pct), 1), 4),
            "bound": round(bound_by_key[worst.tenant], 1) if worst else 0.0,
            "within_bound": within,
            "shortfall": round(shortfall / ideal, 5) if ideal else 0.0,
            "utilisation": round(1 - shortfall / ideal, 5) if ideal else 1.0,
            "fairness": round(jain(shares), 5),
            "quiet_share": round(min(1.0, sum(k.admitted for k in quiet) / q_ideal), 5)
            if q_ideal
            else None,
        }


def jain(xs: list[float]) -> float:
    """Jain's fairness index: 1 when everyone gets the same share, 1/n when one gets all."""
    if not xs:
        return 1.0
    s = sum(xs)
    sq = sum(x * x for x in xs)
    return s * s / (len(xs) * sq) if sq else 1.0


def envelope_summary(
    admissions: dict[str, list[tuple[int, int]]], policies: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    """The strict guarantee's figures from recorded admissions, replacing the mesh's.

    Per tenant, `max_excess` is the most admitted over any interval beyond R x its length
    (`ratemesh.envelope`, one pass, every interval) and `bound` is B, so `within_bound` is
    `admitted <= R*T + B` over every interval; `envelope_excess` is max_excess - bound (<= 0
    when it holds). R and B are the largest the tenant had (policy changes). The worst tenant
    is the one nearest its bound.
    """
    worst: tuple[float, str, float, int] | None = None  # (ratio, tenant, excess, burst)
    within = True
    for tenant in sorted(admissions):
        rows = admissions[tenant]
        rate, burst = policies[tenant]
        lead = excess_over_times([t for t, _ in rows], [u for _, u in rows], rate, 0)
        within &= lead <= burst
        if worst is None or lead / burst > worst[0]:
            worst = (lead / burst, tenant, lead, burst)
    if worst is None:
        return {"within_bound": True, "envelope_excess": 0.0}
    _, tenant, lead, burst = worst
    return {
        "max_excess": round(lead, 1),
        "max_excess_tenant": tenant,
        "bound": float(burst),
        "within_bound": within,
        "envelope_excess": round(lead - burst, 1),
    }

"""What a run is judged by, recorded outside the system from what it admitted.

Nothing here asks the code under test for a figure: every number comes from the arrivals
offered, the instants the strategy admitted them at, and the policy (R, B, b).

The ideal is one exact GCRA per key that sees every request in arrival order. Per key we
keep cumulative admitted and ideal units; their difference, sampled every step, is the lead
over the ideal. The envelope is checked over every interval too: from the recorded admission
instants, the most admitted in any [t0, t1] beyond R * (t1 - t0) + B (`ratemesh.envelope`, one
pass). `max_excess` is the larger of the two, against `N*b + R*d` (a lead over one ideal can
hide a burst the ideal happened to allow; an interval cannot).

The shortfall is under-service: in each 100 ms window, what the ideal admitted beyond what
the strategy did. (Matching request by request would be wrong: under overload, admitting a
different request of the same tenant at the same moment serves the tenant just as well.)

Starvation is under-service of one request: a request of amount <= b, asked again every
`retry_ms`, for which an exact token bucket (R, B) fed the same admitted history held room
throughout some stretch of d plus one retry interval, and that was still not admitted when
the stretch ended (`starvation`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from mesh.core.gcra import NS_PER_S, Gcra
from ratemesh.envelope import excess_bound, excess_over_times
from sim.scenario import Policy
from sim.workload import Arrival, TenantInfo

__all__ = ["Asked", "KeyRecord", "Recorder", "envelope_summary", "jain", "starvation"]

WINDOW_NS = 100_000_000  # plot resolution: admitted rate per 100 ms


@dataclass(frozen=True, slots=True)
class Asked:
    """One request that was asked again after a denial: first offered at `first_ns`, then
    every `retry_ns`, until `admitted_ns` (None: never) or, unadmitted, `end_ns` (given up, or
    the run ended)."""

    amount: int
    first_ns: int
    end_ns: int
    admitted_ns: int | None
    retry_ns: int


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
        "asked",
        "last_offer",
        "pauses",
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
        self.asked: list[Asked] = []  # requests asked again after a denial
        # Per worker, when it last offered; and each pause of a worker past
        # ESCROW_AFTER_NS as (from, length): an owner may escrow that worker's floor then
        # (`escrow_charges`), which the starvation reference is charged with.
        self.last_offer: dict[str, int] = {}
        self.pauses: list[tuple[int, int]] = []

    def change_policy(self, policy: Policy, now_ns: int) -> None:
        self.policy = policy
        self.ideal_meter.retune(policy.rate, policy.burst, now_ns)
        self.max_rate = max(self.max_rate, policy.rate)
        self.max_b = max(self.max_b, policy.local_burst_cap)
        self.max_burst = max(self.max_burst, policy.burst)


class Recorder:
    def __init__(self, tenants: dict[str, TenantInfo], start_ns: int, step_ns: int) -> None:
        self.tenants = tenants
        # tenant -> (t_ns, units) per admission, in time order: every strategy is judged over
        # every interval of it (bounded by the run)
        self.admissions: dict[str, list[tuple[int, int]]] = {}
        self.start_ns = start_ns
        self.step_ns = step_ns
        self.keys: dict[str, KeyRecord] = {}
        self.requests = 0
        self.attempts = 0  # asks, the first ones and those after a denial
        self.steps = 0
        self.end_ns = start_ns
        # denials of amounts > B (no exact limiter could ever admit them) whose verdict said
        # waiting could help; and of amounts <= B whose verdict said it could not
        self.unservable_said_retry = 0
        self.servable_said_never = 0
        self.above_b_said_retry = 0  # amounts in (b, B]: disclosed, not judged

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
        self.attempts += 1
        k.offered += a.amount
        k.workers.add(a.worker)
        last = k.last_offer.get(a.worker)
        if last is not None and now_ns - last > ESCROW_AFTER_NS:
            k.pauses.append((last + ESCROW_AFTER_NS, now_ns - last - ESCROW_AFTER_NS))
        k.last_offer[a.worker] = now_ns
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
        if used > 0:
            self.admissions.setdefault(a.tenant, []).append((now_ns, used))

    def asked(self, tenant: str, asked: Asked) -> None:
        """A request asked again after a denial has ended: admitted, given up, or the run
        ended (`starvation` judges it)."""
        self.keys[tenant].asked.append(asked)

    def verdict_said(self, a: Arrival, wait_helps: bool | None) -> None:
        """What the strategy said of a denied request's first ask: may waiting help?"""
        if wait_helps is None:
            return
        k = self.keys[a.tenant]
        if wait_helps and a.amount > k.policy.burst:
            self.unservable_said_retry += 1
        elif wait_helps and a.amount > k.policy.local_burst_cap:
            self.above_b_said_retry += 1  # global mode promises too_large for these
        elif not wait_helps and a.amount <= k.policy.burst:
            self.servable_said_never += 1

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
        self.end_ns = end_ns
        idx = (end_ns - self.start_ns + WINDOW_NS - 1) // WINDOW_NS
        for k in self.keys.values():
            k.excess_sum += k.last_excess * (steps - k.last_step)
            k.last_step = steps
            self._roll(k, idx)
        self.steps = steps

    def envelope(self) -> dict[str, Any]:
        """The strict figures from what this recorder saw admitted (`envelope_summary`)."""
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
        excess_by_key: dict[str, float] = {}
        interval_by_key: dict[str, float] = {}
        for k in keys:
            n = max(len(k.workers), 1) if k.workers else n_default
            bound = excess_bound(n, k.max_b, k.max_rate, d_ns)
            bound_by_key[k.tenant] = bound
            interval = self.interval_excess(k)
            interval_by_key[k.tenant] = interval
            # A retried request is judged by the ideal once, when first offered, and counted
            # when a retry gets it in: the lead of such a tenant says nothing of the envelope.
            load = self.tenants[k.tenant].load
            retried = load is not None and load.retry_ms is not None
            excess = interval if retried else max(float(k.max_excess), interval)
            excess_by_key[k.tenant] = excess
            within &= excess <= bound
            ratio = excess / bound if bound else 0.0
            if ratio > worst_ratio:
                worst_ratio, worst = ratio, k
            mean = k.excess_sum / max(self.steps, 1)
            mean_pct.append(100.0 * mean / k.max_rate)
        shares = [min(1.0, k.admitted / k.ideal) for k in keys if k.ideal > 0]
        quiet = [k for k in keys if k.quiet]
        q_ideal = sum(k.ideal for k in quiet)
        out: dict[str, Any] = {
            "admitted": admitted,
            "ideal": ideal,
            "max_excess": round(max(excess_by_key[worst.tenant], 0.0), 1) if worst else 0,
            "max_excess_tenant": worst.tenant if worst else None,
            # the two measures max_excess is the larger of, for its tenant
            "lead_excess": worst.max_excess if worst else 0,
            "interval_excess": round(max(interval_by_key[worst.tenant], -1e18), 1)
            if worst
            else 0.0,
            "mean_excess": round(
                sum(k.excess_sum for k in keys) / max(self.steps, 1) / max(len(keys), 1), 3
            ),
            "mean_excess_pct_of_rate": round(sum(mean_pct) / max(len(mean_pct), 1), 4),
            "bound": round(bound_by_key[worst.tenant], 1) if worst else 0.0,
            "bound_formula": "N*b + R*d",
            "within_bound": within,
            "shortfall": round(shortfall / ideal, 5) if ideal else 0.0,
            "utilisation": round(1 - shortfall / ideal, 5) if ideal else 1.0,
            "fairness": round(jain(shares), 5),
            "quiet_share": round(min(1.0, sum(k.admitted for k in quiet) / q_ideal), 5)
            if q_ideal
            else None,
            "attempts": self.attempts,
            "unservable_said_retry": self.unservable_said_retry,
            "servable_said_never": self.servable_said_never,
            "above_b_said_retry": self.above_b_said_retry,
        }
        out.update(self.starvation(d_ns))
        return out

    def interval_excess(self, k: KeyRecord) -> float:
        """The most `k`'s tenant had admitted over any interval beyond R x its length + B
        (R and B the largest it had); -inf with nothing admitted."""
        rows = self.admissions.get(k.tenant, [])
        return excess_over_times(
            [t for t, _ in rows], [u for _, u in rows], k.max_rate, k.max_burst
        )

    def starvation(self, d_ns: int) -> dict[str, Any]:
        """Requests starved, over every key (`starvation`), with the worst key's count."""
        starved: dict[str, int] = {}
        amounts: dict[int, int] = {}
        above_b = 0
        judged = 0
        for k in sorted(self.keys.values(), key=lambda k: k.tenant):
            if not k.asked:
                continue
            rows = self.admissions.get(k.tenant, []) + escrow_charges(k, self.end_ns)
            found = starvation(
                k.asked,
                rows,
                rate=k.max_rate,
                burst=k.max_burst,
                largest=k.max_burst,
                d_ns=d_ns,
                start_ns=self.start_ns,
                end_ns=self.end_ns,
                step_ns=self.step_ns,
            )
            judged += sum(1 for q in k.asked if q.amount <= k.max_b)
            for q in found:
                amounts[q.amount] = amounts.get(q.amount, 0) + 1
            above_b += sum(1 for q in found if q.amount > k.max_b)
            found = [q for q in found if q.amount <= k.max_b]
            if found:
                starved[k.tenant] = len(found)
        worst = max(sorted(starved), key=lambda t: starved[t], default=None)
        return {
            "starved": sum(starved.values()),
            "starved_tenant": worst,
            # disclosed, not judged: amounts above b (and at most B) an exact bucket could serve
            "starved_above_b": above_b,
            "starved_amounts": {str(a): n for a, n in sorted(amounts.items())},
            "asked_again": sum(len(k.asked) for k in self.keys.values()),
            "starvation_judged": judged,
        }


# A mesh owner may escrow the floor of a worker that paused (docs/partitions.md): from
# ESCROW_AFTER_NS after its last report until its idle mark arrives (about ESCROW_SPAN_NS
# later), at most R / N a second. The escrow is charged to the key like usage, so an exact
# bucket judging starvation is charged as much at each pause (docs/guarantees.md).
ESCROW_AFTER_NS = 30_000_000
ESCROW_SPAN_NS = 220_000_000


def escrow_charges(k: KeyRecord, end_ns: int) -> list[tuple[int, int]]:
    """The most owners may have escrowed for `k`'s workers' pauses, as (time, units) rows."""
    n = max(len(k.workers), 1)
    pauses = list(k.pauses)
    for last in k.last_offer.values():  # the pause each worker ended the run in
        if end_ns - last > ESCROW_AFTER_NS:
            pauses.append((last + ESCROW_AFTER_NS, end_ns - last - ESCROW_AFTER_NS))
    return [
        (at, -(-k.max_rate * min(span, ESCROW_SPAN_NS) // (n * NS_PER_S))) for at, span in pauses
    ]


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


def starvation(
    asked: list[Asked],
    admissions: list[tuple[int, int]],
    *,
    rate: float,
    burst: int,
    largest: int,
    d_ns: int,
    start_ns: int,
    end_ns: int,
    step_ns: int,
) -> list[Asked]:
    """The requests of `asked` (amount <= `largest`) that starved: there was a time t in the
    request's life such that an exact token bucket (rate R, burst B, full at `start_ns`) fed the
    strategy's own `admissions` (drained by them, never refusing one: its level may go below
    zero) held at least the amount throughout [t, t + d + retry interval], and the request
    was not admitted by t + d + retry interval. Such a bucket could have served it after
    everything the strategy did admit, and the mesh had d to learn so and one retry to say so.

    The bucket's level is sampled every `step_ns` after that step's admissions (arrivals are
    decided on the step grid); a window's least level is the least sample in it. Each request
    is judged alone: where many wait on the same room (a tenant offering more than R), each
    of them is counted, so a tenant whose starvation is judged should offer less than R.
    """
    if not asked:
        return []
    n = max((end_ns - start_ns) // step_ns, 0) + 1
    per_step = rate * step_ns / NS_PER_S
    level = [0.0] * n
    cur = float(burst)
    i = 0
    rows = sorted(admissions)
    for s in range(n):
        t = start_ns + s * step_ns
        if s:
            cur = min(float(burst), cur + per_step)
        while i < len(rows) and rows[i][0] <= t:
            cur -= rows[i][1]
            i += 1
        level[s] = cur
    out = []
    # window in steps -> the most, over a range of s, of the least level over [s, s + window]
    highs: dict[int, _RangeMax] = {}
    for q in asked:
        if q.amount > largest:
            continue
        tol_ns = d_ns + q.retry_ns
        w = -(-tol_ns // step_ns)
        done_ns = q.admitted_ns if q.admitted_ns is not None else q.end_ns
        if done_ns - q.first_ns <= tol_ns:
            continue  # served (or gone) within the grace: nothing to judge
        high = highs.get(w)
        if high is None:
            high = highs[w] = _RangeMax(_window_min(level, w))
        first = -(-(q.first_ns - start_ns) // step_ns)
        # t + grace must come before an admission, and no later than the end of an ask
        last = (done_ns - tol_ns - start_ns - (q.admitted_ns is not None)) // step_ns
        if high.max(max(first, 0), min(last, n - 1)) >= q.amount:
            out.append(q)
    return out


class _RangeMax:
    """The largest of xs[i..j], inclusive, in O(1) after O(n log n) (a sparse table)."""

    def __init__(self, xs: list[float]) -> None:
        self.rows = [xs]
        span = 1
        while 2 * span <= len(xs):
            prev = self.rows[-1]
            self.rows.append([max(prev[i], prev[i + span]) for i in range(len(prev) - span)])
            span *= 2

    def max(self, i: int, j: int) -> float:
        if j < i:
            return float("-inf")
        k = (j - i + 1).bit_length() - 1
        row = self.rows[k]
        return max(row[i], row[j - (1 << k) + 1])


def _window_min(xs: list[float], w: int) -> list[float]:
    """For each s, min(xs[s : s + w + 1]) (the window cut short at the end): a monotone
    deque, one pass."""
    out = [0.0] * len(xs)
    dq: deque[int] = deque()  # indices whose levels rise from front to back
    for j in range(len(xs) - 1, -1, -1):
        while dq and xs[dq[-1]] >= xs[j]:
            dq.pop()
        dq.append(j)
        while dq[0] > j + w:
            dq.popleft()
        out[j] = xs[dq[0]]
    return out

"""The hot path: `try_admit` decides locally, with no clock, no I/O and no allocation.

A view per (metric, tenant) holds `avail`; admitting subtracts from it and adds to `pending`.
Everything that needs time or the network (refill, reports, snapshots, TTLs) happens in
`tick`/the reporter, off the hot path. Verdicts are prebuilt per view and shared; the
detailed form (`try_admit_detailed`) adds the view's per-moment numbers to a fresh copy.
"""

from __future__ import annotations

from collections.abc import Callable

from mesh.core._validate import check_int
from mesh.core.admission._cooldown import CooldownGate
from mesh.core.admission._gates import FixedGate, LocalGate, unknown_verdict
from mesh.core.admission._modes import OPENERS
from mesh.core.admission._queue import TenantQueues, Waiter
from mesh.core.admission._redis import RedisDesk, RedisGate
from mesh.core.admission._shadow import WouldDeny
from mesh.core.admission._strict import CreditDesk, StrictGate
from mesh.core.config import CoreConfig
from mesh.core.gate import Gate
from mesh.core.policy import BOUNDS, PolicyCache, TenantRatePolicy
from mesh.core.quota import QuotaDesk
from mesh.core.reporter import Reporter
from mesh.core.verdict import STOPPED, Numbers, Reason, Step, Verdict, shadowed, verdict
from mesh.errors import ConfigError, ConfigTypeError
from ratemesh.policy import DESCRIPTOR_SEP, METRICS_MAX, check_metric

__all__ = ["Admission", "UNKNOWN", "QUEUE_FULL", "DEADLINE", "STOPPED"]

# (metric, tenant) pairs cooling down at once (`cool`): a peer's notice names keys, so the
# map has a bound like every other; past it a new cooldown is refused (and counted).
COOLDOWNS_MAX = 4096
# Views the idle sweep visits per tick: with a 5 ms tick, ~400,000 a second, and a slice
# holds the lock for well under a millisecond (the hot path waits on it in threaded apps).
VIEWS_SWEEP_SLICE = 2048
UNKNOWN = unknown_verdict()
_NONE: dict[str, Gate] = {}  # the view map of a metric with none (never written)
QUEUE_FULL = verdict(False, Reason.QUEUE_FULL, None, "tenant_queue_bound", step=Step.QUEUE)
DEADLINE = verdict(False, Reason.DEADLINE_EXCEEDED, None, "deadline", step=Step.QUEUE)


class Admission:
    """Local admission for one worker, across all tenants, metrics and modes."""

    def __init__(
        self,
        policies: PolicyCache,
        now_ns: int,
        *,
        reporter: Reporter | None = None,
        config: CoreConfig | None = None,
        n_live: int = 1,
        membership_stale: bool = False,
        credit: CreditDesk | None = None,
        redis: RedisDesk | None = None,
        quotas: QuotaDesk | None = None,
    ) -> None:
        if not isinstance(policies, PolicyCache):
            raise ConfigTypeError(
                "policies", f"must be a PolicyCache, got {type(policies).__name__}"
            )
        check_int("now_ns", now_ns)
        check_int("n_live", n_live, minimum=1)
        if credit is not None and not isinstance(credit, CreditDesk):
            raise ConfigTypeError("credit", f"must be a CreditDesk, got {type(credit).__name__}")
        self.policies = policies
        self.reporter = reporter
        self.credit = credit  # strict limits' credit; None: they fail closed
        # redis limits' breaker and counts; None (no shared_state.redis): each process
        # enforces them alone, suspended redis_unreachable (docs/redis.md)
        self.redis = redis
        self.asked: RedisGate | None = None  # the view of the last REDIS_ASK (_redis.py)
        self.quotas = quotas  # spend quotas' ledger (docs/quotas.md); None: they fail closed
        self.config = config or (reporter.config if reporter else CoreConfig())
        self.n_live = n_live
        self.membership_stale = membership_stale
        self._now_ns = now_ns
        # metric -> tenant -> view. A metric's map is made at its first admission under a
        # policy (a name with no policy never gets one), so it holds at most the policy
        # cache's METRICS_MAX names.
        self._gates: dict[str, dict[str, Gate]] = {}
        self._settle: set[LocalGate] = set()  # local/share views to settle at the next tick
        self._shares: dict[LocalGate, None] = {}  # share views, in order (a set with order)
        self._policy_version = policies.version
        self.queues = TenantQueues(self.config.tenant_queue_max)
        self.gate_count = 0
        # The idle sweep: the (metric, tenants) still to visit in this pass, and when the
        # next pass starts.
        self._sweep_left: list[tuple[str, list[str]]] = []
        self._swept = 0  # views this pass forgot
        self._sweep_at_ns = now_ns + self.config.views_idle_ns
        self.stopped = False  # `stop`: every form answers STOPPED
        # (metric, tenant) -> until (ns, this worker's clock): the fleet's 429 cooldowns
        # (`cool`, docs/cooldown.md); a view under one is wrapped in a CooldownGate.
        self.cooldowns: dict[tuple[str, str], int] = {}
        self.cooldowns_refused = 0
        # Told (tenant, metric value, view) when the idle sweep forgets a view, so that what
        # a driver keeps per view (the node's decision counts) goes with it.
        self.on_forget: Callable[[str, str, Gate], None] | None = None
        # What limits in shadow posture would have denied (_shadow.py, docs/policies.md)
        self.would_deny = WouldDeny()

    # -- the hot path ---------------------------------------------------------------------

    def try_admit(self, tenant: str, metric: str, amount: int = 1) -> Verdict:
        """Admit `amount` units (or bytes) for `tenant` now, or say why not."""
        try:
            v = self._gates[metric][tenant]
        except KeyError:
            return self._first_use(tenant, metric, amount)
        if amount.__class__ is int and 0 < amount <= v.avail:
            v.avail -= amount
            v.pending += amount
            if v.pending >= v.flush_at:
                v.sink(v)
            return v.ok
        if v.__class__ is StrictGate and amount.__class__ is int and 0 < amount <= v.amount_max:
            # `amount_max`: what `_deny` checks first. Then `StrictGate.admit`'s common case,
            # inline (pinned to it and to the holder by tests/mesh/core/test_strict_gate.py):
            # the mesh passes it, and the fast block has the units, before `until`, in the
            # millisecond whose spends the gate tells the holder next.
            front = v.front
            if front is None or amount <= front.avail:
                now_ns = v.clock_ns()
                block = v.block
                if now_ns < v.until_ns and amount <= block.left and now_ns < v.batch_end_ns:
                    block.left -= amount
                    if front is not None:
                        front.avail -= amount
                        front.pending += amount
                        if front.pending >= front.flush_at:
                            front.sink(front)
                    return v.ok
            return v.admit(amount)
        return self._deny(v, amount)

    def try_admit_detailed(
        self, tenant: str, metric: str, amount: int = 1, *, now_ns: int | None = None
    ) -> Verdict:
        """`try_admit`, the same decision, as a fresh verdict carrying the view's numbers at
        `now_ns` (default: the last tick): `remaining`, `retry_after_ms`, `reset_after_ms`
        (docs/api.md). It allocates; the hot path stays `try_admit`."""
        return self.detail(self.try_admit(tenant, metric, amount), tenant, metric, amount, now_ns)

    def detail(
        self, v: Verdict, tenant: str, metric: str, amount: int, now_ns: int | None = None
    ) -> Verdict:
        """`v`, a verdict just given for (`tenant`, `metric`, `amount`), with its view's
        numbers (`numbers`). With no view (no policy, stopped) there are none to give:
        `v` itself, whose `retry_after_ms` None says waiting cannot help."""
        seen = self._view_numbers(v, tenant, metric, amount, now_ns)
        return v if seen is None else seen[0].detailed(v, seen[1])

    def numbers(
        self, v: Verdict, tenant: str, metric: str, amount: int, now_ns: int | None = None
    ) -> Numbers | None:
        """What `detail` adds to a fresh verdict, for callers that put it on a wire without
        building one (the sidecar): the view's numbers, or None with no view."""
        seen = self._view_numbers(v, tenant, metric, amount, now_ns)
        return None if seen is None else seen[1]

    def _view_numbers(
        self, v: Verdict, tenant: str, metric: str, amount: int, now_ns: int | None
    ) -> tuple[Gate, Numbers] | None:
        """`Gate.numbers` of the view that gave `v`; a `too_large` amount's retry is None
        (waiting cannot help)."""
        g = None
        if not self.stopped and v.reason is not Reason.POLICY_UNKNOWN:
            # the view `try_admit` just used, as it found it (a valid name: it decided)
            g = self._gates.get(metric, _NONE).get(tenant) if metric.__class__ is str else None
            if g is None:
                g = self.gate(tenant, metric)
        if g is None:
            return None
        n = g.numbers(amount, v.allowed, self._now_ns if now_ns is None else now_ns)
        if v.reason is Reason.TOO_LARGE:
            n = n._replace(retry_after_ms=None)
        return g, n

    def charge(self, tenant: str, metric: str, nbytes: int) -> Verdict:
        """Pre-charge a transfer chunk before it is sent (byte metrics)."""
        return self.try_admit(tenant, metric, nbytes)

    def refund(self, tenant: str, metric: str, amount: int) -> None:
        """Give back what was charged and not used (a short send). The correction reaches
        the owner in a later report, as a smaller (possibly negative) delta. After `stop`
        it does nothing: the views are gone, and a refund in an app's cleanup path should
        not turn a shutdown into an error. Nor does a refund to a view the idle sweep forgot:
        it was forgotten because it held nothing (a full bucket, everything acknowledged),
        so there is nothing to give back to."""
        _check_amount(amount)
        if self.stopped:
            return
        try:
            v = self._gates.get(metric, _NONE).get(tenant)
        except TypeError:  # unhashable: the checks below name it
            v = None
        if v is None:
            m = check_metric(metric, error=ConfigError)  # a bad name says so; on a miss only
            base = self._spends_as(tenant, m)
            if base is not None:  # a descriptor charged on its tenant's key
                return self.refund(base, m, amount)
            if type(tenant) is str and self.policies.current(tenant, m) is not None:
                return  # its view was forgotten idle: nothing is held to give back
            raise ConfigError("tenant", f"{tenant!r} has no charge on {metric} to refund")
        v.refund(amount)  # each mode gives back what it can (`Gate.refund`)

    def _deny(self, v: Gate, amount: int) -> Verdict:
        _check_amount(amount)
        # A spend quota has no burst (its ledger decides); any other view, asked for more
        # than it can ever hold (B; a share's burst; b for a global view): no wait helps,
        # and the verdict says so rather than `rate_limited`.
        if v.policy.quota is None and amount > v.largest and v.avail < amount:
            out = v.too_large()
        else:
            out = v.deny(amount, self)
        if v.ok.shadow and not out.allowed:
            # Shadow posture: the view denied exactly as enforcing (nothing charged); the
            # caller is admitted and the would-deny counted (_shadow.py).
            p = v.policy
            self.would_deny.add(p.tenant_id, p.metric, out.reason, amount)  # a StrEnum: a str
            return shadowed(out)
        return out

    def _first_use(self, tenant: str, metric: str, amount: int) -> Verdict:
        if self.stopped:  # `stop` emptied the views: every call lands here
            return STOPPED
        m = check_metric(metric, error=ConfigError)
        if type(tenant) is not str or not tenant:
            raise ConfigTypeError("tenant", f"must be a non-empty string, got {tenant!r}")
        _check_amount(amount)
        policy = self.policies.current(tenant, m)
        if policy is None:
            return UNKNOWN
        if policy.tenant_id != tenant:
            # A descriptor with no policy of its own spends from its tenant's limit, on the
            # tenant's key and view (docs/policies.md, resolution step 4): no view of its own.
            return self.try_admit(policy.tenant_id, m, amount)
        if self.gate_count >= self.config.views_max:
            self.evict_idle()
        by_tenant = self._gates.get(m)
        if by_tenant is None:
            assert len(self._gates) < METRICS_MAX, "the policy cache bounds the metric names"
            by_tenant = self._gates[m] = {}
        by_tenant[tenant] = self._cooled(self._open(policy), m, tenant)
        self.gate_count += 1
        return self.try_admit(tenant, m, amount)

    # -- the fleet's 429 cooldown (docs/cooldown.md) ---------------------------------------

    def cool(self, tenant: str, metric: str, until_ns: int) -> bool:
        """Admit nothing for (`tenant`, `metric`) until `until_ns` (a cooldown only grows).
        False if COOLDOWNS_MAX pairs are already cooling (refused, counted)."""
        k = (metric, tenant)
        if k not in self.cooldowns and len(self.cooldowns) >= COOLDOWNS_MAX:
            self.cooldowns_refused += 1
            return False
        until = max(self.cooldowns.get(k, 0), until_ns)
        self.cooldowns[k] = until
        by_tenant = self._gates.get(metric)
        v = None if by_tenant is None else by_tenant.get(tenant)
        if v is not None and by_tenant is not None:
            if isinstance(v, CooldownGate):
                v.until_ns = until
            else:
                by_tenant[tenant] = CooldownGate(v, until)
        return True

    def uncool(self, tenant: str, metric: str) -> bool:
        """End (`tenant`, `metric`)'s cooldown now (an operator's clear); False if none."""
        if self.cooldowns.pop((metric, tenant), None) is None:
            return False
        by_tenant = self._gates.get(metric)
        v = None if by_tenant is None else by_tenant.get(tenant)
        if by_tenant is not None and isinstance(v, CooldownGate):
            by_tenant[tenant] = v.inner
        return True

    def cooling_ms(self, tenant: str, metric: str, now_ns: int | None = None) -> int:
        """What is left of (`tenant`, `metric`)'s cooldown, in ms (0: none)."""
        until = self.cooldowns.get((metric, tenant), 0)
        return max(0, until - (self._now_ns if now_ns is None else now_ns)) // 1_000_000

    def _cooled(self, v: Gate, metric: str, tenant: str) -> Gate:
        until = self.cooldowns.get((metric, tenant))
        return v if until is None or until <= self._now_ns else CooldownGate(v, until)

    def _cool_tick(self, now_ns: int) -> None:
        """Put back the views whose cooldown ended."""
        for k in [k for k, until in self.cooldowns.items() if until <= now_ns]:
            del self.cooldowns[k]
            metric, tenant = k
            by_tenant = self._gates.get(metric)
            v = None if by_tenant is None else by_tenant.get(tenant)
            if by_tenant is not None and isinstance(v, CooldownGate):
                by_tenant[tenant] = v.inner

    # -- views ----------------------------------------------------------------------------

    def _open(self, policy: TenantRatePolicy) -> Gate:
        """The view a policy is decided by: a fixed answer for a disabled one, the ledger's
        for a spend quota, else its mode's (`_modes.OPENERS`)."""
        if not policy.enabled:
            return FixedGate(policy, _ignore, True, BOUNDS["disabled"])
        if policy.quota is not None:
            if self.quotas is not None:
                return self.quotas.open(policy)
            # No quota ledger attached (no wall clock given): fail closed and say so.
            return FixedGate(
                policy, _ignore, False, BOUNDS["quota_unattached"], None, Reason.QUOTA_EXHAUSTED
            )
        return OPENERS[policy.mode](self, policy)

    def _mark_local(self, v: Gate) -> None:
        assert isinstance(v, LocalGate)
        # Its first use since a settle: what it admits until the next tick is charged as of
        # the last tick (a view that sat full was last settled when it filled).
        v.settled_ns = self._now_ns
        v.marked = True
        v.flush_at = 1 << 62
        self._settle.add(v)

    def evict_idle(self) -> int:
        """Forget every view that holds nothing (`_holds_nothing`). They are rebuilt on next
        use exactly as they would be now, so forgetting them loses nothing."""
        evicted = 0
        for by_tenant in self._gates.values():
            for tenant in list(by_tenant):
                if self._holds_nothing(by_tenant[tenant]):
                    self._evict(by_tenant, tenant)
                    evicted += 1
        return evicted

    def _holds_nothing(self, v: Gate) -> bool:
        """Each mode's own answer (`Gate.idle`): a global view with everything acknowledged
        and no fresh snapshot, a local or share view whose bucket is full, a fixed verdict.
        A view cooling down is kept until its cooldown ends."""
        return v.idle(self)

    def _evict(self, by_tenant: dict[str, Gate], tenant: str) -> None:
        v = by_tenant.pop(tenant)
        if self.on_forget is not None:
            self.on_forget(tenant, v.policy.metric, v)
        v.forget(self, retire=False)
        if v.ok.shadow:
            self.would_deny.forget(tenant, v.policy.metric)
        self.gate_count -= 1

    def _sweep(self, now_ns: int) -> None:
        """Part of the idle sweep: forget up to VIEWS_SWEEP_SLICE idle views, resuming
        where the last tick stopped; a new pass starts every views_idle_ms."""
        if not self._sweep_left:
            if now_ns < self._sweep_at_ns:
                return
            self._sweep_at_ns = now_ns + self.config.views_idle_ns
            self._sweep_left = [(m, list(by)) for m, by in self._gates.items() if by]
            self._swept = 0
        budget = VIEWS_SWEEP_SLICE
        while self._sweep_left and budget > 0:
            metric, tenants = self._sweep_left[-1]
            by_tenant = self._gates[metric]
            while tenants and budget > 0:
                tenant = tenants.pop()
                budget -= 1
                v = by_tenant.get(tenant)
                if v is not None and self._holds_nothing(v):
                    self._evict(by_tenant, tenant)
                    self._swept += 1
            if not tenants:
                self._sweep_left.pop()
        if not self._sweep_left and self._swept > max(self.gate_count, VIEWS_SWEEP_SLICE):
            # The pass forgot more than it kept: give the maps' tables back (a dict keeps
            # its largest table through deletions).
            self._gates = {m: dict(by) for m, by in self._gates.items()}
            if self.reporter is not None:
                self.reporter.compact()
            self._swept = 0

    def gate(self, tenant: str, metric: str) -> Gate | None:
        """The view `tenant` is decided by: its own, or (a descriptor without a policy of its
        own) its tenant's."""
        m = check_metric(metric, error=ConfigError)
        v = self._gates.get(m, _NONE).get(tenant)
        if v is None:
            base = self._spends_as(tenant, m)
            if base is not None:
                v = self._gates.get(m, _NONE).get(base)
        return v

    def _spends_as(self, tenant: str, metric: str) -> str | None:
        """The tenant whose key a descriptor tenant part spends from when it has no policy
        of its own; None for any other."""
        if DESCRIPTOR_SEP not in tenant:
            return None
        policy = self.policies.current(tenant, metric)
        return None if policy is None or policy.tenant_id == tenant else policy.tenant_id

    def gates(self) -> list[Gate]:
        return [v for m in sorted(self._gates) for _, v in sorted(self._gates[m].items())]

    # -- time and membership --------------------------------------------------------------

    def tick(self, now_ns: int) -> int:
        """Settle local views, expire stale global ones, pick up policy changes, and serve
        queued waiters. Returns how many waiters were resolved."""
        self._now_ns = now_ns
        if self.policies.version != self._policy_version:
            self._policies_changed()
        settle, self._settle = self._settle, set()
        for v in settle:
            v.marked = False
            v.flush_at = 1
            if not v.settle(now_ns):
                self._settle.add(v)  # still refilling: settle again next tick
                v.marked = True
                v.flush_at = 1 << 62
        if self.reporter is not None:
            self.reporter.tick(now_ns)
        if self.credit is not None:
            self.credit.tick(now_ns)
        if self._sweep_left or now_ns >= self._sweep_at_ns:
            self._sweep(now_ns)
        if self.cooldowns:
            self._cool_tick(now_ns)
        return self.service(now_ns)

    def service(self, now_ns: int) -> int:
        """Grant queued waiters that fit now (call after snapshots arrive, too)."""
        if not self.queues:
            return 0
        return self.queues.service(now_ns, self.try_admit, self.deadline_verdict)

    def deadline_verdict(self, tenant: str, metric: str) -> Verdict:
        """What a waiter gets at its deadline: DEADLINE, carrying the suspension of a strict
        limit that is failing closed (a degraded answer is never silent)."""
        v = self._gates.get(metric, {}).get(tenant)
        if self.stopped:
            return STOPPED
        said = None if v is None else v.deadline()
        return DEADLINE if said is None else said

    def stop(self) -> list[Waiter]:
        """The worker stopped: from now on `try_admit`, `charge` and the waiting forms
        answer STOPPED and `refund` does nothing. The views are dropped (`try_admit` then
        finds none and `_first_use` answers, so the hot path pays nothing for this); what
        they hold is the reporter's and the credit desk's to flush or give back. Every
        queued waiter is resolved with STOPPED now; returns them."""
        self.stopped = True
        self._gates = {m: {} for m in self._gates}
        self._settle.clear()
        self._shares.clear()
        self.cooldowns.clear()
        self._sweep_left = []
        self.gate_count = 0
        waiters = [w for w in self.queues.drain() if not w.done]
        for w in waiters:
            w.done = True
            w.resolve(STOPPED)
        return waiters

    def enqueue(
        self,
        tenant: str,
        metric: str,
        amount: int,
        deadline_ns: int,
        resolve: Callable[[Verdict], None],
    ) -> Waiter | None:
        """Queue an admission that did not fit; None if the tenant's queue is full."""
        w = Waiter(tenant, check_metric(metric, error=ConfigError), amount, deadline_ns, resolve)
        return w if self.queues.push(w) else None

    def membership(self, n_live: int, stale: bool, now_ns: int) -> None:
        """The live fleet size changed (share mode splits by it; stale => N decays to 1)."""
        self.n_live = max(1, check_int("n_live", n_live))
        self.membership_stale = stale
        for v in self._shares:
            v.resize(self.n_live, stale, now_ns)

    def _policies_changed(self) -> None:
        """A new generation replaces a view; the old key keeps reporting until it drains."""
        self._policy_version = self.policies.version
        for metric, by_tenant in self._gates.items():
            for tenant in list(by_tenant):
                old = by_tenant[tenant]
                new = self.policies.current(tenant, metric)
                if new == old.policy:
                    continue
                old.forget(self, retire=True)  # a cooldown passes it to the view under it
                if new is None:
                    del by_tenant[tenant]
                    self.gate_count -= 1
                else:
                    by_tenant[tenant] = self._cooled(self._open(new), metric, tenant)


def _ignore(v: Gate) -> None:
    v.flush_at = 1 << 62
    v.pending = 0


def _check_amount(amount: object) -> None:
    if type(amount) is not int:
        raise ConfigTypeError("amount", f"must be an integer, got {type(amount).__name__}")
    if amount <= 0:
        raise ConfigError("amount", f"must be > 0, got {amount}")

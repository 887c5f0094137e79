"""One mesh member's cores wired together, still without I/O.

A member is a worker (reporter + admission) and an owner at once. The asyncio node, the
simulator and the tests all drive this same object: they feed it time and messages and
carry out the effects it returns.
"""

from __future__ import annotations

from mesh.core.admission import Admission, CreditDesk, RedisDesk
from mesh.core.concurrency import SlotExchange, SlotGrants, SlotReports
from mesh.core.config import CoreConfig
from mesh.core.cooldown import CooldownDesk
from mesh.core.effects import Effect
from mesh.core.messages import (
    COOLDOWN_MS_MAX,
    CellFold,
    CellPublish,
    CooldownNotice,
    CooldownReport,
    CooldownRow,
    Handover,
    Message,
    ReportBatch,
    SnapshotBatch,
)
from mesh.core.owner import Owner
from mesh.core.policy import PolicyCache
from mesh.core.quota import QuotaDesk
from mesh.core.reporter import Reporter
from mesh.core.ring import Ring

__all__ = ["Member"]


class Member:
    """Reporter, owner and admission of one worker incarnation (`worker_epoch`)."""

    def __init__(
        self,
        member_id: str,
        worker_epoch: int,
        ring: Ring,
        policies: PolicyCache,
        now_ns: int,
        *,
        config: CoreConfig | None = None,
        credit: CreditDesk | None = None,
        redis: RedisDesk | None = None,
        quotas: QuotaDesk | None = None,
    ) -> None:
        self.member_id = member_id
        self.config = config or CoreConfig()
        self.policies = policies
        self.reporter = Reporter(member_id, worker_epoch, ring, config=self.config)
        self.owner = Owner(
            member_id, ring, policies, now_ns, incarnation=worker_epoch, config=self.config
        )
        self.admission = Admission(
            policies,
            now_ns,
            reporter=self.reporter,
            config=self.config,
            n_live=len(ring),
            credit=credit,
            redis=redis,
            quotas=quotas,
        )
        self.credit = credit  # strict limits' credit blocks (None: strict fails closed)
        self.quotas = quotas  # spend quotas (None: quota policies fail closed)
        self.cooldown = CooldownDesk(member_id)  # the fleet's 429 cooldown
        self.slots = SlotExchange(member_id, worker_epoch, policies)  # in-flight caps

    @property
    def ring(self) -> Ring:
        return self.reporter.ring

    def tick(self, now_ns: int) -> list[Effect]:
        """The sync interval: expire and settle views, send reports, refresh reporters."""
        self.admission.tick(now_ns)
        effects = self.reporter.flush(now_ns) + self.owner.tick(now_ns)
        if self.credit is not None:
            effects += self.credit.take()
        if self.quotas is not None:
            effects += self.quotas.tick(self.ring)
        if self.cooldown.until:
            effects += self.cooldown.tick(now_ns, self.ring, self.owner)
        effects += self.slots.tick(now_ns // 1_000_000, self.ring)
        return effects

    def report_429(self, now_ns: int, tenant: str, metric: str, ms: int) -> list[Effect]:
        """The service behind (`tenant`, `metric`)'s limit said 429: cool the limit here now
        and, through its owner, on every worker that uses it (docs/cooldown.md). Nothing
        for a pair with no policy (nothing is admitted for it anyway)."""
        policy = self.policies.current(tenant, metric)
        if policy is None:
            return []
        key = policy.for_tenant(tenant).rate_key if policy.tenant_id != tenant else policy.rate_key
        effects = self.cooldown.report(now_ns, key, ms, self.ring, self.admission)
        if self.ring.owner_of(key) == self.member_id:  # we own it: record it as its owner
            ms = max(1, min(ms, COOLDOWN_MS_MAX))
            own = CooldownReport(self.member_id, self.ring.epoch, (CooldownRow(key, ms),))
            effects += self.cooldown.receive_report(now_ns, own, self.ring, self.owner)
        return effects

    def clear_429(self, tenant: str, metric: str) -> bool:
        """End (`tenant`, `metric`)'s cooldown here, and at its owner if that is this member
        (docs/cooldown.md); False if it has no policy or was not cooling."""
        policy = self.policies.current(tenant, metric)
        if policy is None:
            return False
        key = policy.for_tenant(tenant).rate_key if policy.tenant_id != tenant else policy.rate_key
        return self.cooldown.clear(key, self.admission)

    def flush(self, now_ns: int) -> list[Effect]:
        """Early flush, when the report threshold was crossed between ticks."""
        return self.reporter.flush(now_ns)

    def deliver(self, now_ns: int, message: Message) -> list[Effect]:
        """A message from a peer (already decoded and validated)."""
        if isinstance(message, ReportBatch):
            return self.owner.receive(now_ns, message)
        if isinstance(message, SnapshotBatch):
            if self.reporter.receive(now_ns, message):
                self.admission.service(now_ns)
            return []
        if isinstance(message, Handover):
            self.owner.take_handover(now_ns, message)
            return []
        if isinstance(message, CooldownReport):
            return self.cooldown.receive_report(now_ns, message, self.ring, self.owner)
        if isinstance(message, CooldownNotice):
            self.cooldown.notice(now_ns, message, self.ring, self.admission)
            return []
        if isinstance(message, (CellPublish, CellFold)):
            # The sender is the stream's authenticated member (mesh.peer checked the claim).
            return [] if self.quotas is None else self.quotas.receive(message.sender, message)
        if isinstance(message, (SlotReports, SlotGrants)):  # in-flight caps' global mode
            return list(self.slots.deliver(now_ns // 1_000_000, message.sender, message, self.ring))
        raise TypeError(f"not a mesh message: {type(message).__name__}")

    def ring_changed(self, now_ns: int, ring: Ring, *, stale: bool = False) -> None:
        self.reporter.ring_changed(ring)
        self.owner.ring_changed(now_ns, ring)
        self.admission.membership(len(ring), stale, now_ns)
        if self.quotas is not None:
            self.quotas.ring_changed()

    def leave(self, now_ns: int) -> list[Effect]:
        """Graceful leave: hand every held key to its next owner, then route by the ring
        without this member (reports for those keys are refused here from now on, so
        their workers resend them to the new owner instead of this one forgetting them)."""
        others = [m for m in self.ring.members if m != self.member_id]
        if not others:
            return []  # nobody to hand over to
        # The same epoch: this is our own view until membership says more, and a newer
        # epoch on our reports would have owners refuse them (stale_epoch) until then.
        ring = Ring(others, self.ring.epoch, vnodes=self.ring.vnodes)
        effects = self.owner.hand_over(now_ns, ring)
        self.ring_changed(now_ns, ring)
        return effects

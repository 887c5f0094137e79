"""A member's spend quotas wired together: the ledger (worker side), the folds (owner side),
and the gate admission opens for a quota policy (docs/quotas.md).

The desk takes the driver's wall clock, `wall_ms()` (epoch milliseconds: periods are UTC
calendar days and months), as `CreditDesk` takes a monotonic one; it never reads a clock
itself. The driver calls `tick` every sync interval (it publishes each `publish_ms`),
`receive` with each cell message and the stream's authenticated sender, and
`ring_changed` when the ring moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mesh.core.effects import Effect, Send
from mesh.core.gate import Gate
from mesh.core.messages import CellFold, CellPublish
from mesh.core.policy import BOUNDS, PolicyCache, RateKey, TenantRatePolicy
from mesh.core.quota._fold import CELL_RETENTION_MS, QuotaFolds
from mesh.core.quota._ledger import QUOTA_PUBLISH_MS, QuotaLedger
from mesh.core.quota._period import period_end_ms
from mesh.core.ring import Ring
from mesh.core.verdict import Numbers, QuotaLag, Reason, Step, Verdict
from ratemesh.policy import Period

if TYPE_CHECKING:
    from mesh.core.admission import Admission

__all__ = ["QuotaDesk", "QuotaGate", "EXPIRE_EVERY_MS"]

EXPIRE_EVERY_MS = 10_000  # how often aged cells and past periods' entries are dropped


def _ignore(_: Gate) -> None:
    pass


class QuotaGate(Gate):
    """Admission's view of one quota policy: `avail` stays 0, so every call leaves the
    inlined hot path for `deny`, which hands the amount to `admit` (a quota's check is a
    sum and a compare against the ledger, no GCRA)."""

    __slots__ = ("desk",)

    def __init__(self, policy: TenantRatePolicy, desk: QuotaDesk) -> None:
        super().__init__(policy, _ignore)
        self.desk = desk
        self.flush_at = 1 << 62
        self.set_verdicts(BOUNDS["quota"], deny_reason=Reason.QUOTA_EXHAUSTED, step=Step.QUOTA)

    def admit(self, amount: int) -> Verdict:
        return self.desk.ledger.try_spend(self.desk.wall_ms(), self.policy, amount)

    def deny(self, amount: int, admission: Admission) -> Verdict:
        """The ledger decides (no burst, no GCRA). A refund gives nothing back: a spend
        quota is spent, a cell only grows (docs/quotas.md)."""
        return self.admit(amount)

    def idle(self, admission: Admission) -> bool:
        return True  # a quota's state is the ledger's

    def numbers(self, amount: int, allowed: bool, now_ns: int) -> Numbers:
        """remaining = cap - own - remote; the wait and the reset are the period's end
        (a spent quota frees nothing before it)."""
        now_ms = self.desk.wall_ms()
        lag = self.desk.ledger.state(now_ms, self.policy)
        index = self.desk.ledger.index_of(self.policy.rate_key)
        if lag is None or index is None:
            return Numbers(self.policy.quota, 0 if allowed else None, None)
        assert self.policy.period is not None
        reset = max(0, period_end_ms(self.policy.period, index) - now_ms)
        return Numbers(max(0, lag.cap - lag.own - lag.remote), 0 if allowed else reset, reset)

    def detailed(self, v: Verdict, n: Numbers) -> Verdict:
        """`v` with its numbers and the disclosed lag (QuotaLag) beside the cap."""
        return replace(
            v.with_numbers(n, self.policy.quota),
            quota=self.desk.ledger.state(self.desk.wall_ms(), self.policy),
        )


class QuotaDesk:
    """Ledger + folds of one member, and the gates admission opens for quota policies."""

    def __init__(
        self,
        member_id: str,
        policies: PolicyCache,
        wall_ms: Callable[[], int],
        *,
        publish_ms: int = QUOTA_PUBLISH_MS,
        retention_ms: int = CELL_RETENTION_MS,
    ) -> None:
        self.member_id = member_id
        self.policies = policies
        self.wall_ms = wall_ms
        self.ledger = QuotaLedger(member_id, publish_ms=publish_ms)
        self.folds = QuotaFolds(member_id, self._quota_of, retention_ms=retention_ms)
        self._publish_at_ms = 0
        self._expire_at_ms = 0
        self.cells_received = 0
        self.folds_received = 0

    def _quota_of(self, key: RateKey) -> tuple[int, Period] | None:
        p = self.policies.get(key)
        if p is None or p.quota is None or p.period is None:
            return None
        return p.quota, p.period

    def open(self, policy: TenantRatePolicy) -> QuotaGate:
        return QuotaGate(policy, self)

    def tick(self, ring: Ring) -> list[Effect]:
        """Publish the cells due (each `publish_ms`) and age what is old."""
        now_ms = self.wall_ms()
        if now_ms >= self._expire_at_ms:
            self._expire_at_ms = now_ms + EXPIRE_EVERY_MS
            self.folds.expire(now_ms)
            self.ledger.expire(now_ms)
        self.ledger.n_live = max(1, len(ring))
        if now_ms < self._publish_at_ms and not self.ledger.fresh:
            return []
        self._publish_at_ms = now_ms + self.ledger.publish_ms
        return list(self.ledger.flush(now_ms, ring.epoch, ring.owner_of))

    def receive(self, sender: str, msg: CellPublish | CellFold) -> list[Effect]:
        """A cell message from `sender`, the authenticated member (never `msg.sender`)."""
        now_ms = self.wall_ms()
        if isinstance(msg, CellPublish):
            self.cells_received += len(msg.cells)
            return [Send(sender, self.folds.publish(now_ms, sender, msg))]
        self.folds_received += 1
        self.ledger.folded(now_ms, msg)
        return []

    def lag_for(self, tenant: str, metric: str) -> QuotaLag | None:
        """The disclosed numbers for the quota `tenant` spends from on `metric` (None: not
        a quota here, or no entry yet): what a detailed verdict carries beside the cap."""
        p = self.policies.current(tenant, metric)
        if p is None or p.quota is None:
            return None
        return self.ledger.state(self.wall_ms(), p)

    def health(self, shown_max: int) -> dict[str, Any]:
        """/health's `quotas` section: per quota key this worker spends from (at most
        `shown_max`, the rest counted), its cap, own, remote and lag_ms; the owner side's
        folds and the cells it refused, by reason."""
        now_ms = self.wall_ms()
        rows = []
        keys = self.ledger.keys()
        for key in keys[:shown_max]:
            p = self.policies.get(key)
            lag = None if p is None else self.ledger.state(now_ms, p)
            if p is None or lag is None:
                continue
            assert p.period is not None
            rows.append(
                {
                    "tenant_id": key.tenant_id,
                    "metric": key.metric,
                    "generation": key.policy_generation,
                    "period": p.period.value,
                    "period_index": self.ledger.index_of(key),
                    **lag._asdict(),
                }
            )
        return {
            "publish_ms": self.ledger.publish_ms,
            "retention_ms": self.folds.retention_ms,
            "quotas": rows,
            "quotas_omitted": max(0, len(keys) - shown_max),
            "folds": len(self.folds),
            "cells_received": self.cells_received,
            "folds_received": self.folds_received,
            "refused": dict(sorted(self.folds.refused.items())),
        }

    def ring_changed(self) -> None:
        self.ledger.ring_changed(self.wall_ms())
        self._publish_at_ms = 0  # at the next tick: a new owner is rebuilt from the cells

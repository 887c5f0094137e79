"""SlotExchange: a member's two sides of global in-flight caps on the peer wire.

Each sync interval the worker side's reports go out batched per owner (`SlotReports`, at
most SLOT_ROWS_MAX rows each; a scope this member owns is answered in place, no message);
the owner side answers a batch with one `SlotGrants`; a worker adopts grants from the
scope's owner as its own ring says. A report for a scope with no concurrency policy here
is skipped (the owner grants nothing it cannot size).
"""

from __future__ import annotations

from mesh.core.concurrency._desk import SlotDesk
from mesh.core.concurrency._owner import SlotOwner
from mesh.core.concurrency._timings import SlotTimings
from mesh.core.effects import Send
from mesh.core.messages._slots import (
    SLOT_ROWS_MAX,
    SlotGrant,
    SlotGrants,
    SlotReport,
    SlotReports,
)
from mesh.core.policy import PolicyCache
from mesh.core.ring import Ring

__all__ = ["SlotExchange"]


class SlotExchange:
    """One member's SlotDesk and SlotOwner, driven by its tick and its peers' messages."""

    def __init__(
        self,
        member_id: str,
        worker_epoch: int,
        policies: PolicyCache,
        timings: SlotTimings | None = None,
    ) -> None:
        self.member_id = member_id
        self.policies = policies
        self.desk = SlotDesk(member_id, worker_epoch, timings)
        self.owner = SlotOwner(member_id, timings)

    def tick(self, now_ms: int, ring: Ring) -> list[Send]:
        """Report to each owner; answer our own scopes' reports in place."""
        if not (self.desk.scopes or self.owner.scopes):
            return []  # no concurrency limit in use here: the node's tick pays one test
        self.owner.tick(now_ms)
        by_owner: dict[str, list[SlotReport]] = {}
        for to, report in self.desk.tick(now_ms, ring):
            by_owner.setdefault(to, []).append(report)
        out: list[Send] = []
        for to in sorted(by_owner):
            rows = by_owner[to]
            if to == self.member_id:
                for g in self._answer(now_ms, self.member_id, rows):
                    self.desk.receive(now_ms, self.member_id, g, ring)
                continue
            for i in range(0, len(rows), SLOT_ROWS_MAX):
                batch = tuple(rows[i : i + SLOT_ROWS_MAX])
                out.append(Send(to, SlotReports(self.member_id, ring.epoch, batch)))
        return out

    def deliver(
        self, now_ms: int, sender: str, msg: SlotReports | SlotGrants, ring: Ring
    ) -> list[Send]:
        """A peer's reports (answered) or an owner's grants (adopted). `sender` is the
        stream's authenticated member."""
        if isinstance(msg, SlotGrants):
            for g in msg.rows:
                self.desk.receive(now_ms, sender, g, ring)
            return []
        grants = self._answer(now_ms, sender, list(msg.rows))
        return (
            [Send(sender, SlotGrants(self.member_id, ring.epoch, tuple(grants)))] if grants else []
        )

    def health(self) -> dict[str, int]:
        """What /health shows: this worker's slots, and the scopes this member owns."""
        owned = self.owner.scopes
        return {
            "scopes": len(self.desk.scopes),
            "in_flight": self.desk.total_in_flight(),
            "leases": len(self.desk.leases),
            "owned_scopes": len(owned),
            "owned_members": sum(len(m) for m in owned.values()),
            "members_dropped": self.owner.dropped,
            "reports_refused": self.owner.refused,
            "lease_ttl_ms": self.desk.timings.lease_ttl_ms,
            "member_ttl_ms": self.desk.timings.member_ttl_ms,
        }

    def _answer(self, now_ms: int, sender: str, rows: list[SlotReport]) -> list[SlotGrant]:
        out: list[SlotGrant] = []
        for r in rows:
            policy = self.policies.current(*r.scope)
            if policy is None or policy.concurrency is None:
                continue
            if policy.tenant_id != r.scope[0]:
                policy = policy.for_tenant(r.scope[0])
            g = self.owner.receive(now_ms, sender, r, policy)
            if g is not None:
                out.append(g)
        return out

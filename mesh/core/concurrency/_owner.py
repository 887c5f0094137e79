"""SlotOwner: the owner's side of global in-flight caps.

Per scope it counts each member's holdings: the most of the in-flight count and allowance
in its latest report and every grant it issued within the lease TTL (a grant the worker may
still be admitting under). A grant is what the member asks for, at most b, out of what the
other members' counts leave of C (`grant_size`), so the counted total stays <= C. A member
with no report for `member_ttl_ms` is dropped: a crashed worker's slots come back to the
fleet; a live one cut off that long may still hold them (the N x b of the bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mesh.core.concurrency._formula import grant_size
from mesh.core.concurrency._timings import SlotTimings
from mesh.core.messages._slots import Scope, SlotGrant, SlotReport
from ratemesh.policy import TenantRatePolicy

__all__ = ["GRANTS_KEPT", "SlotOwner"]

# Grants a member's record keeps within the lease TTL; past it the oldest fold into one
# entry as large as the largest, dated as the newest (counts longer, never less).
GRANTS_KEPT = 32


@dataclass(slots=True)
class _Held:
    epoch: int
    seq: int
    in_flight: int
    allowance: int
    last_ms: int
    grants: list[tuple[int, int]] = field(default_factory=list)  # (issued_ms, allowance)

    def counted(self, now_ms: int, ttl_ms: int) -> int:
        live = [g for t, g in self.grants if now_ms - t < ttl_ms]
        return (
            max(self.in_flight, self.allowance, *live)
            if live
            else max(self.in_flight, self.allowance)
        )

    def granted(self, now_ms: int, allowance: int, ttl_ms: int) -> None:
        self.grants = [(t, g) for t, g in self.grants if now_ms - t < ttl_ms]
        self.grants.append((now_ms, allowance))
        if len(self.grants) > GRANTS_KEPT:
            self.grants = [(now_ms, max(g for _, g in self.grants))]


class SlotOwner:
    """Counts and grants slots for the scopes this member owns; clock passed in (ms)."""

    def __init__(self, member_id: str, timings: SlotTimings | None = None) -> None:
        self.member_id = member_id
        self.timings = timings or SlotTimings()
        self.scopes: dict[Scope, dict[str, _Held]] = {}
        self.refused = 0  # reports refused: implausible numbers, a full table
        self.dropped = 0  # members dropped after the member TTL without a report

    def receive(
        self, now_ms: int, sender: str, report: SlotReport, policy: TenantRatePolicy
    ) -> SlotGrant | None:
        """Apply `sender`'s report and answer it; None for a stale or duplicate report, or
        one refused (numbers above C, a full table), which changes nothing."""
        cap = policy.concurrency
        assert cap is not None, "a slot report needs a concurrency policy"
        if (
            max(report.in_flight, report.allowance, report.want) > cap
            or min(report.in_flight, report.allowance, report.want, report.seq) < 0
        ):
            self.refused += 1
            return None
        members = self.scopes.get(report.scope)
        if members is None:
            if len(self.scopes) >= self.timings.keys_max:
                self.refused += 1
                return None
            members = self.scopes[report.scope] = {}
        h = members.get(sender)
        if h is None or report.worker_epoch > h.epoch:  # a new process holds nothing old
            if h is None and len(members) >= self.timings.members_max:
                self.refused += 1
                return None
            h = members[sender] = _Held(report.worker_epoch, -1, 0, 0, now_ms)
        elif report.worker_epoch < h.epoch or report.seq <= h.seq:
            return None
        h.seq, h.in_flight, h.allowance, h.last_ms = (
            report.seq,
            report.in_flight,
            report.allowance,
            now_ms,
        )
        ttl = self.timings.lease_ttl_ms
        others = sum(o.counted(now_ms, ttl) for m, o in members.items() if m != sender)
        g = grant_size(cap, policy.local_burst_cap, others, report.want)
        h.granted(now_ms, g, ttl)
        return SlotGrant(report.scope, report.worker_epoch, report.seq, g, ttl)

    def tick(self, now_ms: int) -> list[tuple[Scope, str]]:
        """Drop members silent past the member TTL, and scopes left empty; the dropped
        (scope, member) pairs, for telemetry and tests."""
        dropped: list[tuple[Scope, str]] = []
        for scope in sorted(self.scopes):
            members = self.scopes[scope]
            for m in sorted(members):
                if now_ms - members[m].last_ms > self.timings.member_ttl_ms:
                    del members[m]
                    dropped.append((scope, m))
                    self.dropped += 1
            if not members:
                del self.scopes[scope]
        return dropped

    def counted(self, scope: Scope, now_ms: int) -> int:
        """The scope's counted holdings over its members (<= C while no one was dropped)."""
        members = self.scopes.get(scope, {})
        return sum(h.counted(now_ms, self.timings.lease_ttl_ms) for h in members.values())

    def members(self, scope: Scope) -> list[str]:
        return sorted(self.scopes.get(scope, {}))

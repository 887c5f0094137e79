"""SlotDesk: one worker's in-flight slots, in every mode.

`acquire` takes a slot under a concurrency policy or says why not, and hands back a lease
id that `release` takes; a lease given a TTL (a sidecar client's token) is released by
`expire` when it runs out, so a client that crashed frees what it held. `local` and `share`
decide from this worker's gauge alone (`slot_cap`). `global` decides against the allowance
the scope's owner granted: `tick` reports holdings and wants to the owners, `receive` adopts
an owner's grant, timed from when the report it answers was sent, and a worker whose grant
ran out (owner unreachable, a partition) admits nothing new until a fresh one arrives.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import StrEnum

from mesh.core.concurrency._formula import CONCURRENCY_BOUNDS, SHARE_STALE_BOUND, slot_cap
from mesh.core.concurrency._timings import SlotTimings, usable_ms
from mesh.core.messages._slots import Scope, SlotGrant, SlotReport, ring_key
from mesh.core.ring import Ring
from ratemesh.policy import Mode, TenantRatePolicy

__all__ = ["SENT_KEPT", "SlotDesk", "SlotReason", "SlotVerdict"]

# Reports a scope remembers the send time of: a grant answering an older one is ignored.
SENT_KEPT = 16


class SlotReason(StrEnum):
    ADMITTED = "admitted"
    AT_CAP = "concurrency_limited"  # this worker holds all it may (C, its share, its grant)
    NO_ALLOWANCE = "no_allowance"  # global: no live grant from the owner (yet, or any more)
    KEYS_FULL = "slot_keys_full"  # the desk's scope table is at its bound: fail closed
    LEASES_FULL = "slot_leases_full"  # the desk's lease table is at its bound


@dataclass(frozen=True, slots=True)
class SlotVerdict:
    """The answer to an acquire: a value. `lease` is the id `release` takes (0: denied);
    `in_flight` and `cap` are this worker's after the decision; `bound` the mode's."""

    allowed: bool
    reason: SlotReason
    lease: int
    in_flight: int
    cap: int
    mode: Mode
    bound: str

    def to_dict(self) -> dict[str, object]:
        return {
            "allowed": self.allowed,
            "reason": self.reason.value,
            "lease": self.lease,
            "in_flight": self.in_flight,
            "cap": self.cap,
            "mode": self.mode.value,
            "bound": self.bound,
        }


@dataclass(slots=True)
class _Scope:
    policy: TenantRatePolicy
    in_flight: int = 0
    allowance: int = 0
    expires_ms: int = 0  # global: the allowance holds while now < this
    seq: int = 0  # the last report's sequence number
    adopted: int = -1  # the report whose grant we hold
    sent: dict[int, int] = field(default_factory=dict)  # seq -> sent_ms, SENT_KEPT newest
    demand: int = 0  # acquires asked since the last report
    peak: int = 0  # recent in-flight + demand: what it keeps asking for (`_want`)
    peak_ms: int = 0  # when the peak was last raised or decayed
    last_ms: int = 0

    def allowance_at(self, now_ms: int) -> int:
        return self.allowance if now_ms < self.expires_ms else 0


@dataclass(slots=True)
class _Lease:
    scope: Scope
    expires_ms: int | None


class SlotDesk:
    """A worker's slots across scopes; clock passed in (ms); no I/O."""

    def __init__(
        self, member_id: str, worker_epoch: int, timings: SlotTimings | None = None
    ) -> None:
        self.member_id = member_id
        self.worker_epoch = worker_epoch
        self.timings = timings or SlotTimings()
        self.scopes: dict[Scope, _Scope] = {}
        self.leases: dict[int, _Lease] = {}
        self._next_lease = 1
        self._expiries: list[tuple[int, int]] = []  # (expires_ms, lease), a heap
        self._stale = False  # the verdict being built is share mode's under stale membership

    def acquire(
        self,
        policy: TenantRatePolicy,
        now_ms: int,
        n_live: int,
        ttl_ms: int | None = None,
        *,
        stale: bool = False,
    ) -> SlotVerdict:
        """Take one slot under `policy` (already for its tenant) or say why not. A lease
        with `ttl_ms` is released by `expire` once it runs out. `stale`: membership is
        stale, so share mode's N decays to 1 (and its verdicts say so)."""
        self._stale = stale and policy.mode is Mode.SHARE
        if stale:
            n_live = 1
        assert policy.concurrency is not None, "acquire takes a concurrency policy"
        scope = (policy.tenant_id, policy.metric)
        s = self.scopes.get(scope)
        if s is None:
            if len(self.scopes) >= self.timings.keys_max:
                return self._verdict(False, SlotReason.KEYS_FULL, 0, policy, 0, 0)
            s = self.scopes[scope] = _Scope(policy, last_ms=now_ms)
        s.policy = policy  # the newest generation decides; slots held count across them
        s.last_ms = now_ms
        s.demand += 1
        cap = slot_cap(policy, n_live, s.allowance_at(now_ms))
        if s.in_flight >= cap:
            why = SlotReason.AT_CAP
            if policy.mode is Mode.GLOBAL and now_ms >= s.expires_ms:
                why = SlotReason.NO_ALLOWANCE
            return self._verdict(False, why, 0, policy, s.in_flight, cap)
        if len(self.leases) >= self.timings.leases_max:
            return self._verdict(False, SlotReason.LEASES_FULL, 0, policy, s.in_flight, cap)
        lease = self._next_lease
        self._next_lease += 1
        self.leases[lease] = _Lease(scope, None if ttl_ms is None else now_ms + ttl_ms)
        if ttl_ms is not None:
            heapq.heappush(self._expiries, (now_ms + ttl_ms, lease))
        s.in_flight += 1
        return self._verdict(True, SlotReason.ADMITTED, lease, policy, s.in_flight, cap)

    def release(self, lease: int) -> bool:
        """Give a slot back; False for a lease not held (released, expired, unknown)."""
        held = self.leases.pop(lease, None)
        if held is None:
            return False
        s = self.scopes.get(held.scope)
        if s is not None:
            s.in_flight -= 1
            assert s.in_flight >= 0, "released more slots than were taken"
        return True

    def expire(self, now_ms: int) -> int:
        """Release every lease whose TTL ran out; how many. The TTL'd leases wait in a heap
        by expiry, so a tick pays for those that ran out, not for every lease held."""
        n = 0
        heap = self._expiries
        while heap and heap[0][0] <= now_ms:
            _, lease = heapq.heappop(heap)
            n += self.release(lease)  # False: released before its TTL ran out
        return n

    def tick(self, now_ms: int, ring: Ring) -> list[tuple[str, SlotReport]]:
        """Expire TTL'd leases, forget idle scopes, and report each global scope with
        something held or wanted to its owner: (owner, report) pairs."""
        self.expire(now_ms)
        out: list[tuple[str, SlotReport]] = []
        for scope in sorted(self.scopes):
            s = self.scopes[scope]
            allowance = s.allowance_at(now_ms)
            if not (s.in_flight or allowance or s.demand):
                if now_ms - s.last_ms > self.timings.member_ttl_ms:
                    del self.scopes[scope]  # holds nothing: rebuilt as it is on next use
                continue
            if s.policy.mode is not Mode.GLOBAL:
                s.demand = 0
                continue
            s.seq += 1
            s.sent[s.seq] = now_ms
            if len(s.sent) > SENT_KEPT:
                del s.sent[min(s.sent)]
            want = self._want(s, now_ms)
            s.demand = 0
            report = SlotReport(scope, self.worker_epoch, s.seq, s.in_flight, allowance, want)
            out.append((ring.owner_of(ring_key(scope)), report))
        return out

    def _want(self, s: _Scope, now_ms: int) -> int:
        """The recent peak of in-flight + demand and one more: a scope that goes quiet for a
        while keeps its slots for a lease rather than giving them back and waiting a round
        trip for the next request; past that the peak decays by an eighth a lease."""
        now_need = s.in_flight + s.demand
        if now_need >= s.peak:
            s.peak, s.peak_ms = now_need, now_ms
        elif now_ms - s.peak_ms >= self.timings.lease_ttl_ms:
            s.peak, s.peak_ms = max(now_need, s.peak * 7 // 8), now_ms
        return min(s.policy.local_burst_cap, s.peak + (1 if s.peak else 0))

    def receive(self, now_ms: int, sender: str, grant: SlotGrant, ring: Ring) -> bool:
        """Adopt an owner's grant: only from the scope's owner as this worker's ring says,
        for this process, answering a report it remembers, and newer than the one held."""
        s = self.scopes.get(grant.scope)
        if (
            s is None
            or grant.worker_epoch != self.worker_epoch
            or grant.seq <= s.adopted
            or grant.seq not in s.sent
            or ring.owner_of(ring_key(grant.scope)) != sender
        ):
            return False
        ttl = min(grant.lease_ttl_ms, self.timings.lease_ttl_ms)
        s.adopted = grant.seq
        s.allowance = max(0, grant.allowance)
        s.expires_ms = s.sent[grant.seq] + usable_ms(ttl)
        return True

    def in_flight(self, scope: Scope) -> int:
        s = self.scopes.get(scope)
        return 0 if s is None else s.in_flight

    def total_in_flight(self) -> int:
        return sum(s.in_flight for s in self.scopes.values())

    def _verdict(
        self,
        allowed: bool,
        reason: SlotReason,
        lease: int,
        policy: TenantRatePolicy,
        in_flight: int,
        cap: int,
    ) -> SlotVerdict:
        bound = SHARE_STALE_BOUND if self._stale else CONCURRENCY_BOUNDS[policy.mode]
        return SlotVerdict(allowed, reason, lease, in_flight, cap, policy.mode, bound)

"""The fleet-wide 429 cooldown (issue 17, docs/cooldown.md), sans-I/O.

A worker whose call behind a limit was told 429 reports it (`report`): the limit cools down
here at once, and a `CooldownReport` goes to the key's owner. The owner keeps the latest end
per key (its own clock) and sends a `CooldownNotice` with the time left to every reporter of
the key whose lease is live, at once, and at each tick to reporters that started reporting
since; so the cooldown reaches every worker that uses the limit within one sync interval
plus a message's transit (d). Each worker turns the time left into an end on its own clock.

What a peer says is bounded and checked: a report names keys its sender may report (any
ring member may: it is the sender's own observation) and only keys of a policy the owner
knows (else refused, `no_policy`: made-up tenants take no room), a notice is taken only from
the key's owner as this member's ring has it, durations are at most COOLDOWN_MS_MAX, and the
owner holds at most COOLDOWN_KEYS_MAX keys.

`clear` ends a key's cooldown on this worker and, when this member owns the key, at the
owner (an operator's DELETE /v1/cooldown): the owner tells no one of it again. Workers told
before keep theirs to its end, which the sidecar bounds (`sidecar.cooldown_max_s`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.core.effects import Effect, Send
from mesh.core.messages import (
    COOLDOWN_MS_MAX,
    CooldownNotice,
    CooldownReport,
    CooldownRow,
)
from mesh.core.messages._cooldown import COOLDOWN_ROWS_MAX
from mesh.core.policy import RateKey
from mesh.core.verdict import NS_PER_MS

if TYPE_CHECKING:
    from mesh.core.admission import Admission
    from mesh.core.owner import Owner
    from mesh.core.ring import Ring

__all__ = ["CooldownDesk", "COOLDOWN_KEYS_MAX", "COOLDOWN_DEFAULT_MS"]

COOLDOWN_KEYS_MAX = 4096  # keys one owner holds a cooldown for
COOLDOWN_DEFAULT_MS = 90_000  # seed 003's 90 s


class CooldownDesk:
    def __init__(self, member_id: str) -> None:
        self.member_id = member_id
        self.until: dict[RateKey, int] = {}  # owner side: key -> end (ns, this clock)
        # owner side: the reporter incarnations (worker id, worker epoch) told of the end
        self.told: dict[RateKey, set[tuple[str, int]]] = {}
        self.reported = 0
        self.noticed = 0
        self.cleared = 0
        self.refused: dict[str, int] = {}

    def _refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1

    # -- the worker's side ----------------------------------------------------------------

    def report(
        self, now_ns: int, key: RateKey, ms: int, ring: Ring, admission: Admission
    ) -> list[Effect]:
        """This worker saw a 429 behind `key`: cool it here now, and tell its owner."""
        ms = max(1, min(int(ms), COOLDOWN_MS_MAX))
        admission.cool(key.tenant_id, key.metric, now_ns + ms * NS_PER_MS)
        self.reported += 1
        owner = ring.owner_of(key)
        msg = CooldownReport(self.member_id, ring.epoch, (CooldownRow(key, ms),))
        if owner == self.member_id:
            return []  # we own it: `receive_report` is called by the member directly
        return [Send(owner, msg)]

    def notice(self, now_ns: int, msg: CooldownNotice, ring: Ring, admission: Admission) -> None:
        """An owner's notice: cool each key it owns for the time left."""
        for row in msg.rows:
            if ring.owner_of(row.rate_key) != msg.sender:
                self._refuse("not_owner")
                continue
            key = row.rate_key
            if admission.cool(key.tenant_id, key.metric, now_ns + row.ms * NS_PER_MS):
                self.noticed += 1
            else:
                self._refuse("cooldowns_full")

    # -- the owner's side -----------------------------------------------------------------

    def receive_report(
        self, now_ns: int, msg: CooldownReport, ring: Ring, owner: Owner
    ) -> list[Effect]:
        """A worker's 429: keep the latest end per key we own, and tell its reporters."""
        keys = []
        for row in msg.rows:
            key = row.rate_key
            if ring.owner_of(key) != self.member_id:
                self._refuse("not_ours")
                continue
            if owner.policies.get(key) is None:
                self._refuse("no_policy")
                continue
            if key not in self.until and len(self.until) >= COOLDOWN_KEYS_MAX:
                self._refuse("keys_full")
                continue
            self.until[key] = max(self.until.get(key, 0), now_ns + row.ms * NS_PER_MS)
            self.told[key] = set()
            keys.append(key)
        return self._tell(now_ns, keys, ring, owner)

    def clear(self, key: RateKey, admission: Admission) -> bool:
        """End `key`'s cooldown here (worker) and in our owner's table if we hold it; True if
        there was one to end."""
        here = admission.uncool(key.tenant_id, key.metric)
        owned = self.until.pop(key, None) is not None
        self.told.pop(key, None)
        if here or owned:
            self.cleared += 1
        return here or owned

    def tick(self, now_ns: int, ring: Ring, owner: Owner) -> list[Effect]:
        """Forget ended cooldowns; tell reporters that started since."""
        if not self.until:
            return []
        for key in [k for k, until in self.until.items() if until <= now_ns]:
            del self.until[key]
            self.told.pop(key, None)
        return self._tell(now_ns, list(self.until), ring, owner)

    def _tell(self, now_ns: int, keys: list[RateKey], ring: Ring, owner: Owner) -> list[Effect]:
        rows: dict[str, list[CooldownRow]] = {}
        for key in sorted(keys):
            left_ms = (self.until[key] - now_ns) // NS_PER_MS
            if left_ms <= 0:
                continue
            told = self.told.setdefault(key, set())
            ks = owner.keys.get(key)
            live = (
                []
                if ks is None
                else sorted(
                    (w, r.worker_epoch)
                    for w, r in ks.reporters.items()
                    if r.lease_until_ns >= now_ns
                )
            )
            for w, epoch in live:  # an incarnation: a restarted worker is told again
                if (w, epoch) not in told:
                    told.add((w, epoch))
                    rows.setdefault(w, []).append(CooldownRow(key, left_ms))
        effects: list[Effect] = []
        for w, rs in sorted(rows.items()):
            for i in range(0, len(rs), COOLDOWN_ROWS_MAX):
                chunk = tuple(rs[i : i + COOLDOWN_ROWS_MAX])
                effects.append(Send(w, CooldownNotice(self.member_id, ring.epoch, chunk)))
        return effects

"""The worker's side of spend-quota convergence: its own burn, the peers' folded burn, and
the admission check against the cap (docs/quotas.md).

Per RateKey the ledger holds the current period's `own` cumulative burn (this worker's
cell), what it last published, and `remote`: the peers' burn, the larger of the owner's
fold (combined minus this worker's cell as the owner holds it) and the Redis tier's fold
when one is configured; both are lower bounds of the true peer burn. Admission allows
`amount` when own + remote + amount <= cap. A quota is spent, never refunded: a cell only
grows (a G-counter), so a refund could not be published.

A worker restarted under the same member id starts with own = 0 and does not know its old
cell; until the first fold of a key answers (`synced`), it publishes 0 (a hello that
changes nothing at the owner) and then takes own = old cell + what it spent since boot.
Publishing its since-boot burn instead would be lost under max(old, new).

Time is epoch milliseconds passed in by the driver (the period comes from it); the core
reads no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from mesh.core.effects import Send
from mesh.core.messages import CELL_ROWS_MAX, Cell, CellFold, CellPublish
from mesh.core.policy import BOUNDS, RateKey, TenantRatePolicy
from mesh.core.quota._fold import QUOTA_KEYS_MAX
from mesh.core.quota._period import period_end_ms, period_index
from mesh.core.verdict import Numbers, QuotaLag, Reason, Step, Verdict, verdict
from ratemesh.policy import Period

__all__ = ["QUOTA_PUBLISH_MS", "QUOTA_REFRESH_MS", "QuotaLedger"]

# How often a worker publishes the cells that changed (seed 002's one-second flush); the
# node's `quota_publish_ms` default.
QUOTA_PUBLISH_MS = 1_000
# A cell spent from (or asked) within this long is re-published every `publish_ms`, changed
# or not, so its worker's remote stays one cadence fresh; an idle one is re-published this
# often: well inside the owner's CELL_RETENTION_MS, so a live worker's idle cell never ages
# out, and a new owner is rebuilt within it even if no ring change was seen (a ring change
# re-publishes at once). An idle entry touched again with its fold older than two cadences
# is published at the next tick.
QUOTA_REFRESH_MS = 60_000


@dataclass(slots=True)
class _Entry:
    period: Period
    period_index: int
    own: int = 0
    published: int = 0  # own as last published (unsynced: 0 was)
    acked: int = 0  # our cell as the owner's last fold held it: below own, publish again
    owner_remote: int = 0
    tier_remote: int = 0
    folded_at_ms: int = -1  # last fold from either source; -1: none yet
    sent_at_ms: int = -1
    touched_ms: int = -1  # the last try_spend on it
    dirty: bool = True  # publish at the next flush
    floor: int = 0  # remote before a ring change, held while the new owner is rebuilt
    floor_until_ms: int = -1
    synced: bool = False  # a fold has told us our own cell (restart recovery)

    @property
    def remote(self) -> int:
        return max(self.owner_remote, self.tier_remote, self.floor)


class QuotaLedger:
    """One worker's quota entries: `try_spend` on the hot path, `flush` each
    `publish_ms`, `folded` / `tier_folded` when answers arrive, `expire` now and then."""

    def __init__(
        self,
        member_id: str,
        *,
        keys_max: int = QUOTA_KEYS_MAX,
        publish_ms: int = QUOTA_PUBLISH_MS,
        refresh_ms: int = QUOTA_REFRESH_MS,
    ) -> None:
        self.member_id = member_id
        self.keys_max = keys_max
        self.publish_ms = publish_ms
        self.refresh_ms = refresh_ms
        self._entries: dict[RateKey, _Entry] = {}
        self.n_live = 1  # ring members: an unfolded entry spends at most cap // n_live
        self.fresh = False  # an entry was opened since the last flush: publish it now

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, now_ms: int, policy: TenantRatePolicy) -> _Entry | None:
        assert policy.period is not None
        key = policy.rate_key
        index = period_index(policy.period, now_ms)
        e = self._entries.get(key)
        if e is None:
            if len(self._entries) >= self.keys_max:
                return None
            e = self._entries[key] = _Entry(policy.period, index)
            self.fresh = True
        elif e.period_index < index:  # roll-over: the new period starts from zero
            self._entries[key] = e = _Entry(policy.period, index, synced=True)
            self.fresh = True
        # A clock that stepped back keeps the later period: a period never reopens.
        return e

    def try_spend(
        self, now_ms: int, policy: TenantRatePolicy, amount: int = 1, *, detailed: bool = False
    ) -> Verdict:
        """Spend `amount` from `policy`'s quota if own + remote + amount <= cap."""
        cap = policy.quota
        assert cap is not None, "try_spend needs a quota policy"
        e = self._entry(now_ms, policy)
        if e is None:
            return verdict(
                False, Reason.QUOTA_EXHAUSTED, policy.mode, BOUNDS["quota_full"], step=Step.QUOTA
            )
        if (
            now_ms - e.folded_at_ms > 2 * self.publish_ms
            and now_ms - e.sent_at_ms > self.publish_ms
        ):
            # idle a while (or never folded), and not sent this cadence: publish at the next
            # tick (not every tick while an owner does not answer)
            self.fresh = True
        e.touched_ms = now_ms
        if e.folded_at_ms >= 0:
            bound, room = BOUNDS["quota"], cap
        else:
            # No fold yet (a worker new to the key, or restarted): it knows nothing of its
            # peers' burn, so it spends as a share would, cap // n_live, until one arrives
            # (a fresh entry is published at the next tick, not a cadence later).
            bound, room = BOUNDS["quota_unfolded"], cap // self.n_live
        if amount > cap:
            v = verdict(False, Reason.TOO_LARGE, policy.mode, bound, limit=cap, step=Step.QUOTA)
        elif e.own + e.remote + amount > room:
            v = verdict(
                False, Reason.QUOTA_EXHAUSTED, policy.mode, bound, limit=cap, step=Step.QUOTA
            )
        else:
            e.own += amount
            v = verdict(True, Reason.ADMITTED, policy.mode, bound, limit=cap, step=Step.QUOTA)
        return self._detail(now_ms, e, cap, v) if detailed else v

    def _detail(self, now_ms: int, e: _Entry, cap: int, v: Verdict) -> Verdict:
        reset = period_end_ms(e.period, e.period_index) - now_ms
        n = Numbers(max(0, cap - e.own - e.remote), None if v.allowed else reset, reset)
        lag = self.lag(now_ms, e, cap)
        return replace(v.with_numbers(n), quota=lag)

    def lag(self, now_ms: int, e: _Entry, cap: int) -> QuotaLag:
        age = None if e.folded_at_ms < 0 else max(0, now_ms - e.folded_at_ms)
        return QuotaLag(cap, e.own, e.remote, age, e.own - e.published)

    def state(self, now_ms: int, policy: TenantRatePolicy) -> QuotaLag | None:
        """The disclosed numbers for `policy`'s key (None: no entry): for /health."""
        e = self._entries.get(policy.rate_key)
        if e is None or policy.quota is None:
            return None
        return self.lag(now_ms, e, policy.quota)

    def index_of(self, key: RateKey) -> int | None:
        """The period index `key`'s entry is in (None: no entry)."""
        e = self._entries.get(key)
        return None if e is None else e.period_index

    def flush(
        self, now_ms: int, ring_epoch: int, owner_of: Callable[[RateKey], str | None]
    ) -> list[Send]:
        """The CellPublishes due now, one or more per owner: changed cells, and every cell
        each `refresh_ms` (or after `ring_changed`). An unsynced cell publishes 0."""
        self.fresh = False
        by_owner: dict[str, list[Cell]] = {}
        for key, e in self._entries.items():
            busy = now_ms - e.touched_ms < self.refresh_ms
            due = now_ms - e.sent_at_ms >= self.refresh_ms
            unacked = e.synced and e.acked < e.own  # a lost publish is sent again
            if not (busy or due or unacked or e.dirty or e.own != e.published):
                continue
            owner = owner_of(key)
            if owner is None:
                continue  # no ring yet: kept dirty, published once there is one
            burn = e.own if e.synced else 0
            by_owner.setdefault(owner, []).append(Cell(key, e.period_index, burn))
            e.published = burn
            e.sent_at_ms = now_ms
            e.dirty = False
        out = []
        for owner in sorted(by_owner):
            cells = by_owner[owner]
            for i in range(0, len(cells), CELL_ROWS_MAX):
                chunk = tuple(cells[i : i + CELL_ROWS_MAX])
                out.append(Send(owner, CellPublish(self.member_id, ring_epoch, chunk)))
        return out

    def ring_changed(self, now_ms: int) -> None:
        """Every cell goes to its (possibly new) owner at the next flush: a new owner's
        fold is rebuilt from the workers' cumulative cells. Until every peer has had a
        cadence to re-publish there, its folds are partial: the remote known before the
        change is held as a floor (peers' burn only grows within a period, so it is still
        a lower bound) for two cadences, then the folds alone count again."""
        for e in self._entries.values():
            e.dirty = True
            e.floor = e.remote
            e.floor_until_ms = now_ms + 2 * self.publish_ms

    def folded(self, now_ms: int, msg: CellFold) -> int:
        """Take an owner's fold rows; the rows applied (others: an old period, a key no
        longer held). The owner's answer is trusted only as far as a lower bound: its
        combined is at least our cell, and remote never exceeds what it says."""
        applied = 0
        for r in msg.rows:
            e = self._entries.get(r.rate_key)
            if e is None or e.period_index != r.period_index:
                continue
            self._recover(e, r.own)
            e.acked = max(e.acked, r.own)
            # The peers' part as the owner holds it: combined minus *our* cell there (own
            # may have grown since the publish it answers, so combined - own would be low).
            e.owner_remote = r.combined - r.own
            e.folded_at_ms = max(e.folded_at_ms, now_ms)
            if e.floor and now_ms >= e.floor_until_ms:
                e.floor = 0  # the new owner has had every peer's cell by now
            applied += 1
        return applied

    def tier_folded(self, now_ms: int, key: RateKey, index: int, cells: Mapping[str, int]) -> bool:
        """Take the Redis tier's cells for one (key, period): ours recovers `own`, the sum
        of the others is the tier's remote. False: not our current period."""
        e = self._entries.get(key)
        if e is None or e.period_index != index:
            return False
        self._recover(e, cells.get(self.member_id, 0))
        e.tier_remote = sum(b for m, b in cells.items() if m != self.member_id)
        e.folded_at_ms = max(e.folded_at_ms, now_ms)
        return True

    def tier_burn(self, key: RateKey) -> tuple[int, int] | None:
        """(period index, burn) to write to the tier for `key` (unsynced: 0)."""
        e = self._entries.get(key)
        if e is None:
            return None
        return e.period_index, e.own if e.synced else 0

    def _recover(self, e: _Entry, cell: int) -> None:
        if not e.synced:  # the first fold since boot: our old cell plus what we spent since
            e.own += cell
            e.synced = True
            e.dirty = True
        elif cell > e.own:
            e.own = cell

    def expire(self, now_ms: int) -> int:
        """Forget entries of a past period (their cells are dropped too); the number gone."""
        gone = [
            k for k, e in self._entries.items() if e.period_index < period_index(e.period, now_ms)
        ]
        for k in gone:
            del self._entries[k]
        return len(gone)

    def keys(self) -> list[RateKey]:
        return sorted(self._entries)

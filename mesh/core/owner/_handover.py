"""Hand-over on graceful leave: a stopping owner sends each key's meter state to the key's
next owner, so the key continues where it was instead of restarting exhausted.

The rule that makes it safe: a handed-over key is never less restrictive than its true
state. The state crosses the wire as "TAT ahead of the sender's now", rounded up
(`Gcra.ahead_ns`), so time in transit only adds debt. A receiver takes a hand-over only

* from a member in its ring, or one that left it within `DEPARTED_GRACE_NS`, and
* for keys that member owns in the ring with it and the receiver owns in the ring without;

everything else is counted and ignored. A key not open yet is parked (at most
`PENDING_MAX` keys, each for `PENDING_TTL_NS`) and resumed from it when it opens, instead
of the conservative start; past the TTL the key starts conservatively, as before. A key
already open keeps the stricter of its own state and the handed state plus everything it
applied since it opened (reports both owners saw count twice: safe, and rare).

A hand-over is input from a peer, so its debt is believed only up to what an honest owner's
meter can hold (`ahead_max_ns`): a full bucket's worth, the fleet's local bursts and one
claim window of the rate (the envelope `B + N*b + R*d`, in time). A member leaving with a
forged debt of centuries can starve the key for that long and no longer.

Reporters' watermarks come along: a report the leaver applied whose ack was lost is then a
duplicate at the new owner rather than usage counted twice. Only the contiguous watermark
is carried (sequences applied past a gap are counted again if resent: safe). A killed
member hands nothing over; its keys move by membership and start conservatively.

A watermark is believed no further than the leaver could know it: a leaver that
set one too high would have the reporter's next reports taken as duplicates, usage never
counted. So a handed watermark

* names a member (of the ring, or departed within `DEPARTED_GRACE_NS`), else it is dropped;
* for a reporter the new owner already has a record of (same incarnation), raises it at
  most to the highest sequence that record has seen: the reporter sent every sequence below
  that one before, to the leaver or here;
* for a reporter new here, makes a record that the reporter's own first report must bear
  out (`ReporterState.confirm`): the same incarnation, and a watermark no higher than
  `unacked_from - 1 + inflight_reports_max`, the most sequences the reporter can have sent,
  as it holds at most that many unacknowledged reports of a key. Otherwise the record
  starts from the reporter's word and the hand-over's is counted refused (`bad_watermark`);
* lasts `HANDED_MARK_TTL_NS`: it is for resends of reports in flight at the leave, which
  come at once (their retry timers, or the reporter's link to the leaver failing); a record
  first reported to later starts from the reporter's word.

A lying leaver can therefore have at most a key's in-flight reports of each reporter taken
as duplicates: usage that was sent to it, which it could as well have dropped while it owned
the key. The meter's debt is believed up to `ahead_max_ns` (above); epochs and versions
saturate at `ORDER_MAX`, so no handed value can make a later snapshot, hand-over or leave fail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mesh.core._validate import INT_MAX
from mesh.core.effects import Effect, Send
from mesh.core.gcra import NS_PER_S, Gcra
from mesh.core.messages import (
    HANDOVER_ROWS_MAX,
    HANDOVER_WATERMARKS_MAX,
    Handover,
    KeyHandover,
    ReporterWatermark,
)
from mesh.core.owner._plausible import ORDER_MAX, Refusal
from mesh.core.owner._state import KeyState, ReporterState
from mesh.core.policy import RateKey
from mesh.core.ring import Ring

if TYPE_CHECKING:
    from mesh.core.owner._owner import Owner

__all__ = [
    "Handovers",
    "export",
    "install",
    "PENDING_MAX",
    "PENDING_TTL_NS",
    "DEPARTED_GRACE_NS",
    "DEPARTED_MAX",
    "HANDED_MARK_TTL_NS",
    "ROWS_PER_MESSAGE",
    "ahead_max_ns",
]

IsMember = Callable[[int, str], bool]  # (now_ns, member id): `Owner.is_member`

PENDING_MAX = 65_536  # handed-over keys parked until they open; the oldest go first
PENDING_TTL_NS = 30_000_000_000  # a parked key unopened this long starts conservatively
DEPARTED_GRACE_NS = 10_000_000_000  # a member that left the ring may hand over this long
DEPARTED_MAX = 1024  # members remembered as just departed
# A handed watermark suppresses resends for this long after it is taken (module docstring):
# the departed grace, the longest a leaver's own messages are taken.
HANDED_MARK_TTL_NS = DEPARTED_GRACE_NS
# Keys + watermarks per Handover message: what a receiver takes (HANDOVER_ROWS_MAX, so that
# one message holds its loop well under 1 ms); a leaver with more sends more messages.
ROWS_PER_MESSAGE = HANDOVER_ROWS_MAX


@dataclass(frozen=True, slots=True)
class _Parked:
    received_ns: int  # on the receiver's clock: the handed debt drains from here
    item: KeyHandover


class Handovers:
    """One owner's side of hand-overs: parked keys, who just left, and counters."""

    def __init__(self) -> None:
        self.pending: dict[RateKey, _Parked] = {}
        self.departed: dict[str, int] = {}  # member -> when it left this owner's ring
        self.sent_keys = 0
        self.resumed = 0  # parked keys opened from their handed state
        self.tightened = 0  # open keys made stricter by a hand-over
        self.expired = 0
        self.ignored: dict[str, int] = {"sender": 0, "not_owner": 0}
        # The rings with and without the last sender, for the ring they were built from: a
        # leaver's hand-over comes as many messages, and building a ring costs more than
        # placing a message's keys (one entry, replaced).
        self._placed: tuple[str, Ring, Ring, Ring] | None = None

    def stats(self) -> dict[str, int]:
        return {
            "sent_keys": self.sent_keys,
            "pending": len(self.pending),
            "resumed": self.resumed,
            "tightened": self.tightened,
            "expired": self.expired,
            "ignored_sender": self.ignored["sender"],
            "ignored_not_owner": self.ignored["not_owner"],
        }

    def park(self, now_ns: int, item: KeyHandover) -> None:
        """Keep a key's handed state until the key opens; a second one for the same key
        keeps the stricter debt and the lower watermarks (fewer duplicates suppressed)."""
        # Taken out and put back at the end: the dict stays in order of arrival, so
        # `_evict` finds the oldest first, at the cost of what it evicts.
        old = self.pending.pop(item.rate_key, None)
        if old is not None and now_ns - old.received_ns <= PENDING_TTL_NS:
            item = _stricter(old, _Parked(now_ns, item))
        elif len(self.pending) >= PENDING_MAX:
            self._evict(now_ns)
        self.pending[item.rate_key] = _Parked(now_ns, item)

    def _evict(self, now_ns: int) -> None:
        """Make room for one: drop the expired from the front (the oldest), or else the
        oldest. Not a scan of every parked key: past PENDING_MAX that ran per key parked,
        5 ms each, and a large hand-over stalled the loop for minutes."""
        pending = self.pending
        while pending:
            key, oldest = next(iter(pending.items()))
            if now_ns - oldest.received_ns <= PENDING_TTL_NS and len(pending) < PENDING_MAX:
                break
            del pending[key]
            self.expired += 1

    def opened(
        self, now_ns: int, ks: KeyState, reporters_max: int, members: int, is_member: IsMember
    ) -> None:
        """`Owner._open` made `ks`: resume it from a parked hand-over, if one is fresh.
        `members`: how many members the key's ring has, the sender put back."""
        parked = self.pending.pop(ks.policy.rate_key, None)
        if parked is None:
            return
        if now_ns - parked.received_ns > PENDING_TTL_NS:
            self.expired += 1
            return
        p = ks.policy
        meter = Gcra(p.target_rate, p.global_burst, now_ns)  # full, then the handed debt
        meter.hold(parked.received_ns, min(parked.item.ahead_ns, ahead_max_ns(ks, members)))
        ks.meter = meter
        ks.exhausted = meter.remaining(now_ns) == 0
        _continue_order(ks, parked.item)
        _adopt_watermarks(
            now_ns, parked.received_ns, ks, parked.item.watermarks, reporters_max, is_member
        )
        self.resumed += 1

    def ring_changed(self, now_ns: int, old: Ring, new: Ring, member_id: str) -> None:
        """Remember who left (they may still hand over); drop parked keys not ours now."""
        for m in old.members:
            if m not in new:
                self.departed[m] = now_ns
        for m in new.members:
            self.departed.pop(m, None)
        while len(self.departed) > DEPARTED_MAX:
            del self.departed[next(iter(self.departed))]
        for key in [
            k
            for k, p in self.pending.items()
            if now_ns - p.received_ns > PENDING_TTL_NS or not new.owns(member_id, k)
        ]:
            del self.pending[key]


def export(owner: Owner, now_ns: int, ring: Ring) -> list[Effect]:
    """The leaving owner's keys as `Handover`s to their owners in `ring` (without it)."""
    if not ring.members:
        return []
    by_owner: dict[str, list[KeyHandover]] = {}
    for key in sorted(owner.keys):
        to = ring.owner_of(key)
        if to == owner.member_id:
            continue
        ks = owner.keys[key]
        # The most recently heard reporters' records, as many as fit one message with the
        # key; the rest resend to the new owner and count again (the safe side).
        recent = sorted((rs.last_seen_ns, w) for w, rs in ks.reporters.items() if rs.watermark > 0)[
            -HANDOVER_WATERMARKS_MAX:
        ]
        marks = tuple(
            ReporterWatermark(w, ks.reporters[w].worker_epoch, ks.reporters[w].watermark)
            for w in sorted(w for _, w in recent)
        )
        by_owner.setdefault(to, []).append(
            KeyHandover(  # saturated: no state a peer induced may make leaving fail
                key,
                min(ks.meter.ahead_ns(now_ns), INT_MAX),
                min(ks.owner_epoch, INT_MAX),
                min(ks.version, INT_MAX),
                marks,
            )
        )
    out: list[Effect] = []
    for to in sorted(by_owner):
        chunk: list[KeyHandover] = []
        rows = 0
        for item in by_owner[to]:
            if chunk and rows + 1 + len(item.watermarks) > ROWS_PER_MESSAGE:
                out.append(Send(to, Handover(owner.member_id, owner.ring.epoch, tuple(chunk))))
                chunk, rows = [], 0
            chunk.append(item)
            rows += 1 + len(item.watermarks)
        out.append(Send(to, Handover(owner.member_id, owner.ring.epoch, tuple(chunk))))
        owner.handovers.sent_keys += len(by_owner[to])
    return out


def install(owner: Owner, now_ns: int, msg: Handover) -> None:
    """Take a hand-over: park or tighten the keys this owner may hold; ignore the rest."""
    h = owner.handovers
    me, ring, sender = owner.member_id, owner.ring, msg.sender
    left_ns = None if sender == me else h.departed.get(sender)
    in_ring = sender != me and sender in ring
    departed = left_ns is not None and now_ns - left_ns <= DEPARTED_GRACE_NS
    placed = h._placed
    if (in_ring or departed) and placed is not None and placed[:2] == (sender, ring):
        with_, without = placed[2], placed[3]
    elif in_ring:
        with_, without = (
            ring,
            Ring((m for m in ring.members if m != sender), ring.epoch, vnodes=ring.vnodes),
        )
        h._placed = (sender, ring, with_, without)
    elif departed:
        # It left our ring just now; placement is a pure function of the members, so the
        # ring it owned the keys in is ours with it put back.
        with_, without = Ring((*ring.members, sender), ring.epoch, vnodes=ring.vnodes), ring
        h._placed = (sender, ring, with_, without)
    else:
        h.ignored["sender"] += len(msg.keys)
        owner.refuse(Refusal.NOT_MEMBER)
        return
    for item in msg.keys:
        key = item.rate_key
        if with_.owner_of(key) != sender or not without.owns(me, key):
            h.ignored["not_owner"] += 1
            continue
        ks = owner.keys.get(key)
        if ks is None:
            h.park(now_ns, item)
            continue
        if _tighten(
            now_ns, ks, item, owner.config.reporters_per_key_max, len(with_), owner.is_member
        ):
            h.tightened += 1
        owner.wake(ks)  # its reporters hear at the next tick


def ahead_max_ns(ks: KeyState, members: int) -> int:
    """The most debt an honest owner's meter of this key can hand over, in ns: B + N*b + R*d
    over R, where `claim_tol` (`_plausible.claim_tolerance`) is (B + b) x 1e9 + R x d."""
    p = ks.policy
    return (ks.claim_tol + max(0, members - 1) * p.local_burst_cap * NS_PER_S) // p.target_rate


def _tighten(
    now_ns: int,
    ks: KeyState,
    item: KeyHandover,
    reporters_max: int,
    members: int,
    is_member: IsMember,
) -> bool:
    """An open key: the handed debt (believed up to `ahead_max_ns`) plus what this owner
    applied since opening, if that is stricter than the key's own state. Returns whether
    the meter tightened."""
    p = ks.policy
    candidate = Gcra(p.target_rate, p.global_burst, now_ns)
    candidate.hold(now_ns, min(item.ahead_ns, ahead_max_ns(ks, members)))
    candidate.apply(now_ns, ks.applied)  # what this owner applied since the key opened
    before = ks.meter.ahead_ns(now_ns)
    ks.meter.hold(now_ns, candidate.ahead_ns(now_ns))
    ks.changes += 1
    if ks.meter.remaining(now_ns) == 0:
        ks.exhausted = True
    _continue_order(ks, item)
    # The handed watermarks may be raised to: the meter now covers the handed state whole.
    _adopt_watermarks(now_ns, now_ns, ks, item.watermarks, reporters_max, is_member)
    return ks.meter.ahead_ns(now_ns) > before


def _continue_order(ks: KeyState, item: KeyHandover) -> None:
    """Snapshots of the key go on ordering after the leaver's (workers never step back)."""
    ks.owner_epoch = max(ks.owner_epoch, min(item.owner_epoch, ORDER_MAX))
    ks.version = max(ks.version, min(item.version, ORDER_MAX))


def _adopt_watermarks(
    now_ns: int,
    taken_ns: int,
    ks: KeyState,
    marks: tuple[ReporterWatermark, ...],
    reporters_max: int,
    is_member: IsMember,
) -> None:
    """Sequences up to a handed watermark are in the handed state: treat resends of them
    as duplicates, believed as far as the module docstring says (for HANDED_MARK_TTL_NS
    from `taken_ns`, when the hand-over came). A record of another worker incarnation is
    left alone."""
    until_ns = taken_ns + HANDED_MARK_TTL_NS
    if until_ns < now_ns:
        return
    for m in marks:
        if not is_member(now_ns, m.worker_id):
            continue  # only members report: a record for anyone else is the leaver's fiction
        rs = ks.reporters.get(m.worker_id)
        if rs is None:
            if len(ks.reporters) >= reporters_max:
                continue  # no room: its resends count again (safe)
            rs = ks.reporters[m.worker_id] = ReporterState(m.worker_epoch, m.watermark + 1, now_ns)
            rs.handed_until_ns = until_ns  # and until its own report confirms it
        elif rs.worker_epoch == m.worker_epoch:
            # Up to the highest sequence seen here: it was sent after every one below it.
            seen = max(rs.above) if rs.above else rs.watermark
            mark = m.watermark if m.watermark < seen else seen
            if mark > rs.watermark:
                rs.watermark = mark
                rs.above = {s for s in rs.above if s > rs.watermark}
                while rs.watermark + 1 in rs.above:
                    rs.watermark += 1
                    rs.above.discard(rs.watermark)


def _stricter(a: _Parked, b: _Parked) -> KeyHandover:
    """Two hand-overs of one parked key: the later debt end, and per reporter the lower
    watermark of the same incarnation (a record only one carries, or of two incarnations,
    is dropped: its resends then count again, which is safe)."""
    first, second = (
        (a, b) if a.received_ns + a.item.ahead_ns >= b.received_ns + b.item.ahead_ns else (b, a)
    )
    theirs = {m.worker_id: m for m in second.item.watermarks}
    marks = tuple(
        ReporterWatermark(m.worker_id, m.worker_epoch, min(m.watermark, o.watermark))
        for m in first.item.watermarks
        if (o := theirs.get(m.worker_id)) is not None and o.worker_epoch == m.worker_epoch
    )
    item = first.item
    return KeyHandover(
        item.rate_key,
        max(0, min(first.received_ns + item.ahead_ns - b.received_ns, INT_MAX)),
        max(a.item.owner_epoch, b.item.owner_epoch),
        max(a.item.version, b.item.version),
        marks,
    )

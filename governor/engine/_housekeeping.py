"""Time-driven work: session expiry, deadlines, AIMD adjustments and purges.

It runs at the start of every call (so expiry is lazy and exact) and from ``tick()`` (so it is also
prompt). Purges of tombstones and ended nodes are pure functions of time and are not recorded.
"""

from __future__ import annotations

import math

from . import _events as ev
from ._core import Core
from ._leasebook import LeaseBook
from ._state import ROOT_ID
from ._timers import PURGE_BLOCK, PURGE_LEASE, PURGE_NODE, PURGE_SESSION
from ._types import NodeState, SessionState

__all__ = ["Housekeeping"]


class Housekeeping:
    """Brings the engine up to its clock: every call's first step is ``advance``."""

    def __init__(self, core: Core, leases: LeaseBook) -> None:
        self._core = core
        self._leases = leases

    def tick(self) -> None:
        """The reaper: expire sessions, fire deadlines, run AIMD, purge old records."""
        self.advance()

    def advance(self) -> int:
        """Do the work that is due by now; returns now (never earlier than the last call's)."""
        core = self._core
        now = core.clock.now_ms()
        if now > core.now_ms:
            core.now_ms = now
        else:
            now = core.now_ms
        t = core.timers
        if (
            (t.expiry and t.expiry[0][0] <= now)
            or (t.deadline and t.deadline[0][0] <= now)
            or core.state.adaptive
        ):
            self._advance_slow(now)
        if t.purge and t.purge[0][0] <= now:
            self._purge(now)
        return now

    def _advance_slow(self, now: int) -> None:
        st, leases, timers = self._core.state, self._leases, self._core.timers
        changed = False
        for sid in timers.due_expiry(now):
            session = st.sessions.get(sid)
            if session is not None and session.state is SessionState.OPEN:
                if session.expires_ms <= now:
                    leases.end_session(session, SessionState.EXPIRED, now)
                    changed = True
        for at_ms, _depth, nid in timers.due_deadline(now):
            node = st.nodes.get(nid)
            if node is not None and node.state is NodeState.ACTIVE and node.deadline_ms == at_ms:
                leases.end_subtree(node, NodeState.DEADLINE_EXCEEDED, None, None, now)
                changed = True
        for cls in sorted(st.adaptive):
            changed = self._adapt(cls, now) or changed
        if changed:
            leases.dispatch()

    def _adapt(self, cls: str, now: int) -> bool:
        """One AIMD step per interval, on evidence gathered under the current limit only.

        p95 over target: x0.7, the seed's cut (a latency signal says the limit is too high, not by
        how much). Overload share over max: a 503 also says where the downstream's capacity is, so
        the cut lands on the concurrency it actually served in the window, clamped between x0.5 and
        x0.7 rounded up (rounding down would cut 6 by a third and 2 by half). One cut then lands
        near the capacity instead of a cascade each costing an interval of sheds, and the x0.5
        floor keeps a collapsed window (refusals crowding out service) from undershooting it.
        Otherwise +1: a limit that never probes never recovers. A cut is always at least one
        lower, the result always within [min_limit, max_limit]. Too few samples: no move.
        """
        core = self._core
        state = core.state.adaptive[cls]
        cfg = state.config
        n = len(state.samples)
        if now - state.last_adjust_ms < cfg.interval_ms or n < cfg.min_samples:
            return False
        limit = core.state.nodes[ROOT_ID].limits.get(cls, cfg.initial_limit)
        cuts: list[int] = []
        if _p95(state.samples) > cfg.target_p95_ms:
            cuts.append(limit * 7 // 10)
        overloaded = sum(1 for _, o in state.samples if o)
        if overloaded * 1000 // n > cfg.max_overload_permille:
            gentlest = min(limit - 1, -(-limit * 7 // 10))
            deepest = min(gentlest, -(-limit // 2))
            served = self._served_concurrency(cls, now)
            cuts.append(gentlest if served is None else max(deepest, min(gentlest, served)))
        new = min(cuts) if cuts else limit + 1
        new = max(cfg.min_limit, min(cfg.max_limit, new))
        core.emit(ev.LimitAdjusted(core.seq(), now, cls, new))
        return True

    def _served_concurrency(self, cls: str, now: int) -> int | None:
        """Leases of ``cls`` held on average in this window, rounded up, not counting those that
        came back overloaded; ``None`` if no lease was held for any time.

        Little's law on the engine's clock: lease time not refused over the time any lease was
        held (idle spells would dilute it). Leases still held count as served so far, so long
        holds are not missed. It is in the units the limit counts, so it includes each lease's
        round trip, which the caller's latency does not.
        """
        state = self._core.state.adaptive[cls]
        start = state.last_adjust_ms
        busy_ms = state.busy_ms
        if state.busy_since_ms is not None:
            busy_ms += now - max(state.busy_since_ms, start)
        if busy_ms <= 0:
            return None
        held_ms = state.ok_ms + sum(
            now - max(lease.granted_ms, start)
            for lease in self._core.state.leases.values()
            if lease.cls == cls
        )
        return -(-held_ms // busy_ms)

    def _purge(self, now: int) -> None:
        st, cfg, timers = self._core.state, self._core.config, self._core.timers
        for _at, _d, kind, ident in timers.due_purge(now):
            if kind == PURGE_LEASE:
                tomb = st.tombstones.get(ident)
                if tomb is not None and tomb.ended_ms + cfg.tombstone_ms <= now:
                    del st.tombstones[ident]
            elif kind == PURGE_SESSION:
                session = st.sessions.get(ident)
                if (
                    session is not None
                    and session.ended_ms is not None
                    and session.ended_ms + cfg.tombstone_ms <= now
                ):
                    del st.sessions[ident]
            elif kind == PURGE_NODE:
                node = st.nodes.get(ident)
                if node is None or node.ended_ms is None or node.parent is None:
                    continue
                if node.children:  # cannot happen (children end first); retry later
                    timers.add_purge(now + 1, node.depth, PURGE_NODE, ident)
                    continue
                parent = st.nodes[node.parent]
                parent.children.discard(ident)
                for resource, used in node.used.items():
                    parent.absorbed[resource] = parent.absorbed.get(resource, 0) + used
                st.count_node(node, -1)
                del st.nodes[ident]
                st.credit.forget_node(ident)
            elif kind == PURGE_BLOCK:
                st.credit.expire(ident, now)


def _p95(samples: list[tuple[int, bool]]) -> int:
    ordered = sorted(s[0] for s in samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]

"""The sequential model of governord for the calls a history records.

It is governord's engine reduced to what the six calls can observe (``governor/engine``):

* **caps**: a consume of k (and a credit block of k units) is charged to the node and every
  ancestor, or to none; it fits if ``used + k <= cap`` on every capped node of the chain.
  Nothing is refunded, except a credit return's unused units (once per block);
* **concurrency limits**: a grant fits if every limited node of the chain holds fewer live
  leases of the class than its limit; a release frees the slot on the whole chain;
* **ids**: lease ids and block ids come from one counter that only grows, so each grant's id
  is larger than every id granted before it (fencing): never reused, never smaller;
* **leases**: live from the grant until released; a second release answers
  ``released=false``; validate says live exactly while the lease is live;
* **credit blocks**: a block's units count as outstanding in every rated node (burst B) of
  its chain, and ``outstanding + units <= B`` at every grant; a return is applied once, only
  while the block is live; a block with no rated node on its chain is granted exactly
  ``min(requested, room of every cap)``.

Where governord depends on time the model cannot see, it accepts either outcome:

* a rated bucket's level (refill at R) is unknown: a ``rate`` denial is always accepted and a
  grant may be smaller than asked; a block counts as outstanding only while it is *surely*
  live (the operation completed before ``grant invoked + ttl``), and a return that says
  ``returned=false`` is accepted once the block may have expired;
* session expiry: with ``lease_expiry`` a live lease may end at any point (validate not live,
  release ``lease_ended``, a grant into a full limit); without it (the default) leases end
  only by release. Record with sessions whose TTL outlasts the run, or set it;
* denials the model does not decide (``node_ended``, ``queue_full``, ``credit_blocks``,
  ``timeout``, ...) are accepted as taking no effect.

The model is nondeterministic (an unknown operation may or may not have taken effect), and
the checker runs it over *sets* of states, the powerset construction Porcupine uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ._history import Op, Tree

__all__ = ["CLOSURE_STATES_MAX", "Model", "Pending", "State", "Step"]

NS_PER_MS = 1_000_000
UNKNOWN_UNITS_MAX = 256  # grants of an unknown reserve the model enumerates (sizes 1..this)
CLOSURE_STATES_MAX = 100_000  # states one closure over pending unknown calls may reach
CLOSURE_CACHE_MAX = 65_536  # closures remembered (the search asks for the same one often)


@dataclass(frozen=True, slots=True)
class State:
    """One state. ``used``/``held`` are indexed like ``Model.quota_keys``/``limit_keys``;
    ``live`` the known live leases, ``anon`` the chains (node, cls) of leases granted by
    unknown calls (nobody knows their ids); ``blocks`` the known live blocks as
    (block_id, units, surely_live_until_ns)."""

    used: tuple[int, ...]
    held: tuple[int, ...]
    max_id: int
    live: frozenset[int] = frozenset()
    released: frozenset[int] = frozenset()
    expired: frozenset[int] = frozenset()
    anon: tuple[tuple[int, str], ...] = ()
    blocks: frozenset[tuple[int, int, int]] = frozenset()
    blocks_ended: frozenset[int] = frozenset()
    pending: tuple[Pending, ...] = ()


# An unknown call that may still take effect: (call, its arguments as sorted pairs). Calls
# with the same arguments are interchangeable, so the pool is a sorted multiset of these.
Pending = tuple[str, tuple[tuple[str, Any], ...]]


@dataclass(frozen=True, slots=True)
class Step:
    """The states an operation can lead to from one state; none, with the reason, if it
    cannot happen there."""

    states: tuple[State, ...]
    reason: str = ""


class Model:
    """The model over ``tree``, knowing the ids the history's ok grants returned (an id the
    history never granted is foreign: the model accepts what is said of it)."""

    def __init__(self, tree: Tree, ops: Sequence[Op], *, lease_expiry: bool = False) -> None:
        self.tree = tree
        self.lease_expiry = lease_expiry
        self.quota_keys: list[tuple[int, str]] = sorted(
            (n.id, r) for n in tree.nodes.values() for r in n.quotas
        )
        self.limit_keys: list[tuple[int, str]] = sorted(
            (n.id, c) for n in tree.nodes.values() for c in n.limits
        )
        self._qi = {k: i for i, k in enumerate(self.quota_keys)}
        self._quota_chains: dict[tuple[int, str], list[int]] = {}
        self._limit_chains: dict[tuple[int, str], list[int]] = {}
        self._closures: dict[frozenset[State], frozenset[State]] = {}
        self.truncated = False  # a closure reached CLOSURE_STATES_MAX (a violation is then unsure)
        self._li = {k: i for i, k in enumerate(self.limit_keys)}
        # grants the history knows: id -> (node, cls) for leases, (node, resource) for blocks
        # with no credit return in the history, used only grows: a pending charge that does
        # not fit now never will (the pool drops it)
        self.refunds = any(op.call == "return_credit" for op in ops)
        self.leases: dict[int, tuple[int, str]] = {}
        self.blocks: dict[int, tuple[int, str]] = {}
        for op in ops:
            if op.outcome != "ok":
                continue
            if op.call == "acquire":
                self.leases[op.result["lease_id"]] = (op.args["node_id"], op.args["cls"])
            elif op.call == "reserve_credit":
                self.blocks[op.result["block_id"]] = (op.args["node_id"], op.args["resource"])

    # ---- keys (the partitioner reads them too) ------------------------------------------

    def quota_chain(self, node_id: int, resource: str) -> list[int]:
        """Indexes into ``used`` of the capped nodes on the chain, leaf first."""
        return [
            self._qi[(n.id, resource)] for n in self.tree.chain(node_id) if resource in n.quotas
        ]

    def limit_chain(self, node_id: int, cls: str) -> list[int]:
        key = (node_id, cls)
        found = self._limit_chains.get(key)
        if found is None:
            found = [self._li[(n.id, cls)] for n in self.tree.chain(node_id) if cls in n.limits]
            self._limit_chains[key] = found
        return found

    def bursts(self, node_id: int, resource: str) -> list[tuple[int, int]]:
        """(node id, burst) of the rated nodes on the chain."""
        return [
            (n.id, n.bursts[resource]) for n in self.tree.chain(node_id) if resource in n.bursts
        ]

    def initial(self) -> State:
        nodes = self.tree.nodes
        used = tuple(nodes[n].used.get(r, 0) for n, r in self.quota_keys)
        held = tuple(nodes[n].held.get(c, 0) for n, c in self.limit_keys)
        return State(used, held, 0)

    # ---- the step ------------------------------------------------------------------------

    def step(self, s: State, op: Op) -> Step:
        fn = _STEPS[op.call]
        return fn(self, s, op)

    def step_all(self, states: Iterable[State], op: Op) -> tuple[frozenset[State], str]:
        """The powerset step: every state any of ``states`` can lead to; a reason if none.

        An unknown call enters the pool of pending calls (validate, a read, enters nothing);
        before a known call, any pending calls may take effect first (the closure)."""
        if op.outcome == "unknown":
            if op.call == "validate":
                return frozenset(states), ""
            sig: Pending = (op.call, tuple(sorted(op.args.items())))
            return frozenset(
                replace(s, pending=tuple(sorted((*s.pending, sig)))) for s in states
            ), ""
        out: set[State] = set()
        reason = ""
        for s in self.closure(states):
            st = self.step(s, op)
            if op.call == "acquire" and not self.lease_expiry:
                out.update(st.states)  # ends no lease, charges no cap: nothing to prune
            else:
                out.update(self._prune(t) for t in st.states)
            if not st.states and not reason:
                reason = st.reason
        return frozenset(out), reason

    def closure(self, states: Iterable[State]) -> frozenset[State]:
        """``states`` and every state reachable by pending calls taking effect, each at most
        once, in any order (bounded by ``CLOSURE_STATES_MAX``: past it, the rest is left out
        and ``truncated`` is set, so the checker turns a violation into ``unknown``)."""
        given = frozenset(states)
        if not any(s.pending for s in given):
            return given
        known = self._closures.get(given)
        if known is not None:
            return known
        out = set(given)
        frontier = [s for s in out if s.pending]
        while frontier and len(out) < CLOSURE_STATES_MAX:
            s = frontier.pop()
            for i, sig in enumerate(s.pending):
                if i and s.pending[i - 1] == sig:
                    continue  # the same call again: the same successors
                rest = replace(s, pending=s.pending[:i] + s.pending[i + 1 :])
                probe = Op(-1, "", sig[0], dict(sig[1]), 0, None, "unknown")
                for t in self.step(rest, probe).states[1:]:
                    if t not in out:
                        out.add(t)
                        if t.pending:
                            frontier.append(t)
        if frontier:
            self.truncated = True
        result = frozenset(out)
        if len(self._closures) >= CLOSURE_CACHE_MAX:
            self._closures.clear()
        self._closures[given] = result
        return result

    def _dead(self, s: State, sig: Pending) -> bool:
        """A pending charge that does not fit on its chain's caps now."""
        a = dict(sig[1])
        amount = a["amount"] if sig[0] == "consume" else 1
        return bool(self._over(s, self.quota_chain(a["node_id"], a["resource"]), amount))

    def _prune(self, s: State) -> State:
        """Drop pending calls that can never take effect again (a release of an ended lease,
        a return of an ended block), so equal states compare equal."""
        if not s.pending:
            return s
        keep = tuple(
            sig
            for sig in s.pending
            if not (
                (
                    sig[0] == "release"
                    and self._lease_state(s, dict(sig[1])["lease_id"])
                    in ("released", "expired", "foreign")
                )
                or (sig[0] == "return_credit" and dict(sig[1])["block_id"] in s.blocks_ended)
                or (
                    not self.refunds
                    and sig[0] in ("consume", "reserve_credit")
                    and self._dead(s, sig)
                )
            )
        )
        return s if len(keep) == len(s.pending) else replace(s, pending=keep)

    # ---- leases ------------------------------------------------------------------------

    def _full(self, s: State, node_id: int, cls: str) -> int | None:
        """The index of a full limit on the chain, or None if one more lease fits."""
        for i in self.limit_chain(node_id, cls):
            if s.held[i] >= self.tree.nodes[self.limit_keys[i][0]].limits[cls]:
                return i
        return None

    def _room(self, s: State, node_id: int, cls: str, depth: int = 0) -> list[State]:
        """States where one more lease fits: ``s`` itself, or (with lease expiry) ``s`` with
        leases holding the full limit ended by expiry, one at a time."""
        full = self._full(s, node_id, cls)
        if full is None:
            return [s]
        if not self.lease_expiry or depth > len(self.limit_keys) + 64:
            return []
        out: list[State] = []
        for lid in sorted(s.live):
            if full in self.limit_chain(*self.leases[lid]):
                out.extend(self._room(self._end(s, lid, expired=True), node_id, cls, depth + 1))
        for i, chain in enumerate(s.anon):
            if full in self.limit_chain(*chain):
                rest = s.anon[:i] + s.anon[i + 1 :]
                t = replace(s, anon=rest, held=self._add(s.held, self.limit_chain(*chain), -1))
                out.extend(self._room(t, node_id, cls, depth + 1))
        return out

    @staticmethod
    def _add(vec: tuple[int, ...], idx: list[int], delta: int) -> tuple[int, ...]:
        if not idx:
            return vec
        out = list(vec)
        for i in idx:
            out[i] += delta
        return tuple(out)

    def _end(self, s: State, lid: int, *, expired: bool) -> State:
        held = self._add(s.held, self.limit_chain(*self.leases[lid]), -1)
        if expired:
            return replace(s, live=s.live - {lid}, expired=s.expired | {lid}, held=held)
        return replace(s, live=s.live - {lid}, released=s.released | {lid}, held=held)

    def _lease_state(self, s: State, lid: int) -> str:
        """``foreign``, ``ungranted``, ``live``, ``released`` or ``expired``."""
        if lid not in self.leases:
            return "foreign"
        if lid in s.live:
            return "live"
        if lid in s.released:
            return "released"
        if lid in s.expired:
            return "expired"
        return "ungranted"

    def _acquire(self, s: State, op: Op) -> Step:
        node, cls = op.args["node_id"], op.args["cls"]
        if op.outcome == "fail":
            if op.error != "concurrency":
                return Step((s,))
            if self._full(s, node, cls) is None:
                return Step(
                    (),
                    f"denied for concurrency, but every limit on node {node}'s "
                    f"chain has room for {cls} ({self._limits_text(s, node, cls)})",
                )
            return Step((s,))
        if op.outcome == "unknown":
            grants = [
                replace(
                    t,
                    anon=tuple(sorted(t.anon + ((node, cls),))),
                    held=self._add(t.held, self.limit_chain(node, cls), 1),
                )
                for t in self._room(s, node, cls)
            ]
            return Step((s, *grants))
        lid = op.result["lease_id"]
        if lid <= s.max_id:
            return Step(
                (),
                f"lease id {lid} is not larger than id {s.max_id} granted before "
                "it (fencing ids only grow)",
            )
        rooms = self._room(s, node, cls)
        if not rooms:
            return Step(
                (),
                f"no room for one more {cls} lease on node {node}'s chain "
                f"({self._limits_text(s, node, cls)}; live leases {sorted(s.live)})",
            )
        held_idx = self.limit_chain(node, cls)
        return Step(
            tuple(
                replace(t, live=t.live | {lid}, held=self._add(t.held, held_idx, 1), max_id=lid)
                for t in rooms
            )
        )

    def _limits_text(self, s: State, node: int, cls: str) -> str:
        parts = []
        for i in self.limit_chain(node, cls):
            nid = self.limit_keys[i][0]
            parts.append(f"node {nid} holds {s.held[i]} of {self.tree.nodes[nid].limits[cls]}")
        return ", ".join(parts) or "no limit"

    def _release(self, s: State, op: Op) -> Step:
        lid = op.args["lease_id"]
        where = self._lease_state(s, lid)
        if where == "foreign":
            return Step((s,))
        if op.outcome == "unknown":
            return Step((s, self._end(s, lid, expired=False)) if where == "live" else (s,))
        if op.outcome == "ok":
            if op.result["released"]:
                if where == "live":
                    return Step((self._end(s, lid, expired=False),))
                return Step((), f"released lease {lid}, which is {where}")
            if where == "released":
                return Step((s,))
            return Step(
                (),
                f"released=false for lease {lid}, which is {where} (only a second "
                "release answers that)",
            )
        return self._ended_answer(s, op, lid, where)

    def _ended_answer(self, s: State, op: Op, lid: int, where: str) -> Step:
        """A release failing ``lease_ended``/``not_found``, or a validate saying not live."""
        error = op.error if op.outcome == "fail" else "not_live"
        if error == "lease_ended":
            ok = where == "expired"
        elif error == "not_found":
            ok = where != "live"
        elif error == "not_live":
            ok = where in ("released", "expired")
        else:
            return Step((s,))
        if ok:
            return Step((s,))
        if where == "live" and self.lease_expiry:
            return Step((self._end(s, lid, expired=True),))
        said = "not live" if error == "not_live" else error
        return Step((), f"{op.call} of lease {lid} answered {said}, but the lease is {where}")

    def _validate(self, s: State, op: Op) -> Step:
        lid = op.args["lease_id"]
        where = self._lease_state(s, lid)
        if where == "foreign" or op.outcome == "unknown":
            return Step((s,))
        if op.outcome == "ok" and op.result["live"]:
            if where == "live":
                return Step((s,))
            return Step((), f"validate says lease {lid} is live, but it is {where}")
        return self._ended_answer(s, op, lid, where)

    # ---- caps ----------------------------------------------------------------------------

    def _over(self, s: State, idx: list[int], amount: int) -> str:
        """Why ``amount`` more does not fit on the chain ('' if it does)."""
        for i in idx:
            nid, resource = self.quota_keys[i]
            cap = self.tree.nodes[nid].quotas[resource]
            if s.used[i] + amount > cap:
                return f"node {nid} has used {s.used[i]} of its {resource} cap {cap}"
        return ""

    def _consume(self, s: State, op: Op) -> Step:
        idx = self.quota_chain(op.args["node_id"], op.args["resource"])
        amount = op.args["amount"]
        over = self._over(s, idx, amount)
        if op.outcome == "unknown":
            return Step((s,) if over else (s, replace(s, used=self._add(s.used, idx, amount))))
        if op.outcome == "fail":
            if op.error == "quota" and not over:
                return Step(
                    (),
                    f"denied for quota, but {amount} more fits on every cap of "
                    f"the chain ({self._used_text(s, idx)})",
                )
            return Step((s,))
        if over:
            return Step((), f"consumed {amount}, but {over}")
        return Step((replace(s, used=self._add(s.used, idx, amount)),))

    def _used_text(self, s: State, idx: list[int]) -> str:
        parts = []
        for i in idx:
            nid, r = self.quota_keys[i]
            parts.append(f"node {nid} {r} {s.used[i]}/{self.tree.nodes[nid].quotas[r]}")
        return ", ".join(parts) or "no cap"

    # ---- credit blocks -------------------------------------------------------------------

    def _outstanding(self, s: State, rated_node: int, resource: str, at_ns: int | None) -> int:
        """Units of known blocks surely live at ``at_ns`` charged to ``rated_node``."""
        if at_ns is None:
            return 0
        total = 0
        for bid, units, until_ns in s.blocks:
            node, res = self.blocks[bid]
            if res == resource and at_ns < until_ns:
                if any(n.id == rated_node for n in self.tree.chain(node)):
                    total += units
        return total

    def _reserve(self, s: State, op: Op) -> Step:
        node, resource, asked = op.args["node_id"], op.args["resource"], op.args["units"]
        idx = self.quota_chain(node, resource)
        caps = [self.tree.nodes[self.quota_keys[i][0]].quotas[resource] - s.used[i] for i in idx]
        room = min([asked, *caps])
        rated = self.bursts(node, resource)
        if op.outcome == "fail":
            if op.error == "quota" and room >= 1:
                return Step(
                    (),
                    f"denied for quota, but every cap of the chain has room "
                    f"({self._used_text(s, idx)})",
                )
            if op.error == "rate" and not rated:
                return Step(
                    (),
                    f"denied for rate, but no node on node {node}'s chain is rated for {resource}",
                )
            return Step((s,))
        if op.outcome == "unknown":
            if room < 1:
                return Step((s,))
            sizes = range(1, min(room, UNKNOWN_UNITS_MAX) + 1) if rated else (room,)
            return Step(
                (
                    s,
                    *(replace(s, used=self._add(s.used, idx, u)) for u in sizes),
                )
            )
        bid, units, ttl_ms = op.result["block_id"], op.result["units"], op.result["ttl_ms"]
        if bid <= s.max_id:
            return Step(
                (),
                f"block id {bid} is not larger than id {s.max_id} granted before "
                "it (ids only grow)",
            )
        if not 1 <= units <= room:
            return Step(
                (),
                f"granted {units} units of {asked} asked, but the room is {room} "
                f"({self._used_text(s, idx)})",
            )
        if not rated and units != room:
            return Step(
                (),
                f"granted {units} units, but with no rated node on the chain "
                f"governord grants min(asked, room) = {room}",
            )
        for rated_node, burst in rated:
            out = self._outstanding(s, rated_node, resource, op.complete_ns)
            if out + units > burst:
                return Step(
                    (),
                    f"granted {units} units while {out} are surely outstanding at "
                    f"node {rated_node}, over its burst {burst}",
                )
        block = (bid, units, op.invoke_ns + ttl_ms * NS_PER_MS)
        return Step(
            (replace(s, used=self._add(s.used, idx, units), max_id=bid, blocks=s.blocks | {block}),)
        )

    def _return(self, s: State, op: Op) -> Step:
        bid, unused = op.args["block_id"], op.args["unused"]
        if bid not in self.blocks:
            return Step((s,))
        block = next((b for b in s.blocks if b[0] == bid), None)
        if op.outcome == "fail":
            return Step((s,))
        if block is None:
            where = "ended" if bid in s.blocks_ended else "not granted yet"
            if op.outcome == "ok" and op.result["returned"]:
                return Step(
                    (),
                    f"return of block {bid} applied, but the block is {where} "
                    "(a return applies once, to a live block)",
                )
            # a no-op answer (`returned: false`) for a block not granted yet is what any id
            # the session does not hold gets: a return never says whether the id exists
            return Step((s,))
        node, resource = self.blocks[bid]
        idx = self.quota_chain(node, resource)
        applied = replace(
            s,
            used=self._add(s.used, idx, -min(unused, block[1])),
            blocks=s.blocks - {block},
            blocks_ended=s.blocks_ended | {bid},
        )
        if op.outcome == "unknown":
            return Step((s, applied))
        if op.result["returned"]:
            return Step((applied,))
        maybe_expired = op.complete_ns is not None and op.complete_ns >= block[2]
        if not maybe_expired:
            return Step(
                (),
                f"return of block {bid} not applied, but the block is surely live "
                f"(granted {block[1]} units, not returned, within its ttl)",
            )
        return Step((replace(s, blocks=s.blocks - {block}, blocks_ended=s.blocks_ended | {bid}),))


_STEPS = {
    "acquire": Model._acquire,
    "release": Model._release,
    "validate": Model._validate,
    "consume": Model._consume,
    "reserve_credit": Model._reserve,
    "return_credit": Model._return,
}

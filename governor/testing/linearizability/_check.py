"""The checker: fencing ids over the whole history, then WGL per independent partition.

**Fencing** (exact, no search): lease and block ids come from one counter, so no id is granted
twice and a grant that completed before another was invoked has the smaller id. Sorting the
grants by id is the only order the counter allows, so checking every real-time pair
(a sweep) decides it exactly.

**Partitions** (P-compositionality): two operations can interact only through state they both
read or write, so the history is split by the keys each touches (union-find):

* an acquire touches every limited (node, cls) of its chain, and its lease id if it got one;
* release and validate touch their lease id (so they join the acquire that granted it);
* a consume touches every capped (node, resource) of its chain;
* a reserve touches its chain's capped and rated (node, resource) and its block id; a return
  its block id.

Separate tenants' subtrees fall apart unless a shared ancestor (the root) caps or limits
what they both use; an operation on a chain with no cap or limit is alone. The partitions do
share the id counter: fencing is checked on its own, above, and inside each partition, but
an order forced jointly by ids in one partition and caps in another is not searched across
them (``partition=False`` searches the whole history as one).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ._history import History, Op
from ._model import Model
from ._wgl import SEARCH_STATES_MAX, search

__all__ = ["Result", "Violation", "check", "partitions"]

EXPLAIN_PREFIX_TAIL = 8  # prefix operations an explanation prints (the last ones)
EXPLAIN_RELATED_MAX = 4  # linearized operations sharing a key with the stuck one, shown


@dataclass(frozen=True, slots=True)
class Violation:
    """``ops``: the operations involved; ``prefix``: the longest linearizable prefix found
    in their partition (empty for a fencing violation)."""

    kind: Literal["fencing", "linearizability"]
    message: str
    ops: tuple[Op, ...]
    prefix: tuple[Op, ...] = ()

    def explain(self) -> str:
        lines = [f"{self.kind} violation: {self.message}"]
        lines += ["  operations involved:"] + [f"    {op.describe()}" for op in self.ops]
        if self.prefix:
            shown = self.prefix[-EXPLAIN_PREFIX_TAIL:]
            skipped = len(self.prefix) - len(shown)
            lines.append(
                f"  longest linearizable prefix: {len(self.prefix)} operations"
                + (f" (the last {len(shown)}):" if skipped else ":")
            )
            lines += [f"    {op.describe()}" for op in shown]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Result:
    """``unknown``: the search bound was reached before a verdict (never a silent ok)."""

    verdict: Literal["ok", "violation", "unknown"]
    ops: int
    partitions: int
    visited: int
    violations: tuple[Violation, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def explain(self) -> str:
        head = (
            f"{self.verdict}: {self.ops} operations in {self.partitions} partitions, "
            f"{self.visited} search states"
        )
        return "\n".join([head, *self.notes, *(v.explain() for v in self.violations)])


def _keys(model: Model, op: Op) -> list[Hashable]:
    a = op.args
    keys: list[Hashable] = []
    if op.call == "acquire":
        keys += [("limit", i) for i in model.limit_chain(a["node_id"], a["cls"])]
        if op.outcome == "ok":
            keys.append(("lease", op.result["lease_id"]))
    elif op.call in ("release", "validate"):
        keys.append(("lease", a["lease_id"]))
    elif op.call == "consume":
        keys += [("quota", i) for i in model.quota_chain(a["node_id"], a["resource"])]
    elif op.call == "reserve_credit":
        keys += [("quota", i) for i in model.quota_chain(a["node_id"], a["resource"])]
        keys += [("burst", n, a["resource"]) for n, _ in model.bursts(a["node_id"], a["resource"])]
        if op.outcome == "ok":
            keys.append(("block", op.result["block_id"]))
    elif op.call == "return_credit":
        keys.append(("block", a["block_id"]))
    return keys


def partitions(model: Model, ops: Sequence[Op]) -> list[list[Op]]:
    """The independent partitions of ``ops`` (each in history order), by shared keys."""
    parent = list(range(len(ops)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[Hashable, int] = {}
    for i, op in enumerate(ops):
        for key in _keys(model, op):
            j = owner.setdefault(key, i)
            ri, rj = find(i), find(j)
            if ri != rj:
                parent[max(ri, rj)] = min(ri, rj)
    groups: dict[int, list[Op]] = {}
    for i, op in enumerate(ops):
        groups.setdefault(find(i), []).append(op)
    return [groups[k] for k in sorted(groups)]


def _grants(ops: Sequence[Op]) -> list[tuple[int, Op]]:
    out = []
    for op in ops:
        if op.outcome != "ok":
            continue
        if op.call == "acquire":
            out.append((op.result["lease_id"], op))
        elif op.call == "reserve_credit":
            out.append((op.result["block_id"], op))
    return out


def check_fencing(ops: Sequence[Op]) -> list[Violation]:
    """Ids granted once, and in real-time order (exact; see the module docs)."""
    grants = _grants(ops)
    out: list[Violation] = []
    by_id: dict[int, list[Op]] = {}
    for gid, op in grants:
        by_id.setdefault(gid, []).append(op)
    for gid, same in sorted(by_id.items()):
        if len(same) > 1:
            out.append(Violation("fencing", f"id {gid} was granted {len(same)} times", tuple(same)))
    # sweep: for each grant b, the largest id among grants completed before b was invoked
    done = sorted(((op.complete_ns or 0, gid, op) for gid, op in grants), key=lambda d: d[:2])
    completes = [d[0] for d in done]
    best: list[tuple[int, Op]] = []
    for _, gid, op in done:
        best.append(max(best[-1], (gid, op), key=lambda t: t[0]) if best else (gid, op))
    for gid, op in grants:
        k = bisect.bisect_left(completes, op.invoke_ns)
        if k and best[k - 1][0] >= gid and best[k - 1][1] is not op:
            earlier = best[k - 1][1]
            if best[k - 1][0] == gid:
                continue  # reported above as granted twice
            out.append(
                Violation(
                    "fencing",
                    f"id {gid} was granted after id {best[k - 1][0]} had been (a later grant "
                    "must have a larger id)",
                    (earlier, op),
                )
            )
    return out


def _explain(model: Model, part: Sequence[Op], prefix: Sequence[int], states: object) -> Violation:
    """The operation the search could not get past, and why, from the longest prefix."""
    assert isinstance(states, frozenset)
    done = set(prefix)
    pending = [op for i, op in enumerate(part) if i not in done]
    known = [op for op in pending if op.outcome != "unknown" and op.complete_ns is not None]
    stuck = min(known, key=lambda op: (op.complete_ns or 0, op.id)) if known else pending[0]
    deadline = stuck.complete_ns if stuck.complete_ns is not None else 1 << 62
    ready = [op for op in pending if op.invoke_ns <= deadline]
    reasons: list[tuple[Op, str]] = []
    for op in ready:
        after, why = model.step_all(states, op)
        if not after:
            reasons.append((op, why))
    first = next((why for op, why in reasons if op is stuck), "")
    message = f"#{stuck.id} must take effect by its completion but cannot"
    message += f": {first}" if first else " (every order of the operations before it fails)"
    others = [f"#{op.id}: {why}" for op, why in reasons if op is not stuck]
    if others:
        message += "; nor can the concurrent " + "; ".join(others)
    mine = set(_keys(model, stuck))
    related = [op for op in (part[i] for i in prefix) if mine & set(_keys(model, op))]
    involved = related[-EXPLAIN_RELATED_MAX:] + [stuck] + [op for op in ready if op is not stuck]
    return Violation("linearizability", message, tuple(involved), tuple(part[i] for i in prefix))


def check(
    history: History,
    *,
    max_states: int = SEARCH_STATES_MAX,
    partition: bool = True,
) -> Result:
    """Check a history: fencing, then each partition by WGL. ``max_states`` bounds the whole
    search; reaching it gives ``unknown`` (with the partition that ran out named)."""
    ops = history.ops
    model = Model(history.tree, ops, lease_expiry=history.lease_expiry)
    violations = check_fencing(ops)
    parts = partitions(model, ops) if partition else [list(ops)]
    visited = 0
    notes: list[str] = []
    unknown = False
    for part in sorted(parts, key=len):
        budget = max_states - visited
        found = search(model, part, max(budget, 0))
        visited += found.visited
        if found.verdict == "violation" and model.truncated:
            unknown = True
            notes.append(
                f"a closure over pending unknown calls reached CLOSURE_STATES_MAX in a "
                f"partition of {len(part)} operations (from #{part[0].id}); its verdict is unknown"
            )
            break
        if found.verdict == "violation":
            violations.append(_explain(model, part, found.prefix, found.states))
        elif found.verdict == "unknown":
            unknown = True
            notes.append(
                f"search bound max_states={max_states} reached in a partition of {len(part)} "
                f"operations (from #{part[0].id}); its verdict is unknown"
            )
            break
    verdict: Literal["ok", "violation", "unknown"] = (
        "violation" if violations else "unknown" if unknown else "ok"
    )
    return Result(verdict, len(ops), len(parts), visited, tuple(violations), tuple(notes))

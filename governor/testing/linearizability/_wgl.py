"""Wing & Gong's search with Lowe's memoisation (WGL), as Porcupine and Knossos run it.

The calls and returns of a history are one list in time order (a call before a return at
the same instant, so touching intervals count as concurrent). The search walks it: at a
call it tries to linearize that operation now (the model accepts it from the current set of
states, and the pair (linearized set, states) has not been seen), lifting the call and its
return out of the list; at a return it has reached an operation that had to take effect by
then and did not, so it backtracks. It ends when the list is empty (linearizable) or the
stack is (not). An unknown outcome's return is put at infinity: it may take effect at any
point after its call, and the model's "no effect" successor lets it never take effect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ._history import Op
from ._model import Model, State

__all__ = ["SEARCH_STATES_MAX", "Search", "search"]

SEARCH_STATES_MAX = 2_000_000  # (linearized set, states) pairs one check may remember
_INF = 1 << 62


@dataclass(frozen=True, slots=True)
class Search:
    """``verdict`` of one partition; on ``violation``, ``prefix`` is the longest linearizable
    prefix found (op ids in their linearized order) and ``states`` the model's states after
    it. ``visited`` counts remembered pairs."""

    verdict: Literal["ok", "violation", "unknown"]
    prefix: tuple[int, ...]
    states: frozenset[State]
    visited: int


def search(model: Model, ops: Sequence[Op], max_states: int = SEARCH_STATES_MAX) -> Search:
    """Run WGL over ``ops`` (one partition) from the model's initial state."""
    n = len(ops)
    # entries: (time, 0 call | 1 return, op index); sorted, then a doubly linked list
    entries: list[tuple[int, int, int]] = []
    for i, op in enumerate(ops):
        entries.append((op.invoke_ns, 0, i))
        end = _INF if op.outcome == "unknown" or op.complete_ns is None else op.complete_ns
        entries.append((end, 1, i))
    entries.sort()
    size = len(entries)
    head = size  # the sentinel's index
    nxt = [p + 1 for p in range(size)] + [0 if size else -1]
    if size:
        nxt[size - 1] = -1
    prv = [p - 1 for p in range(size)] + [-1]
    if size:
        prv[0] = head
    kind = [e[1] for e in entries]
    opi = [e[2] for e in entries]
    ret_of = [0] * n
    for pos, (_, k, i) in enumerate(entries):
        if k == 1:
            ret_of[i] = pos

    def lift(pos: int) -> None:
        r = ret_of[opi[pos]]
        for p in (pos, r):
            a, b = prv[p], nxt[p]
            nxt[a] = b
            if b != -1:
                prv[b] = a

    def unlift(pos: int) -> None:
        r = ret_of[opi[pos]]
        for p in (r, pos):
            a, b = prv[p], nxt[p]
            nxt[a] = p
            if b != -1:
                prv[b] = p

    states: frozenset[State] = frozenset({model.initial()})
    linearized = 0
    stack: list[tuple[int, frozenset[State]]] = []
    seen: set[tuple[int, frozenset[State]]] = set()
    best: tuple[int, ...] = ()
    best_states = states
    entry = nxt[head]
    unknown = [op.outcome == "unknown" or op.complete_ns is None for op in ops]
    while nxt[head] != -1:
        if len(seen) > max_states:
            return Search("unknown", best, best_states, len(seen))
        back = kind[entry] == 1
        if not back:
            i = opi[entry]
            after, _ = model.step_all(states, ops[i])
            if after:
                key = (linearized | (1 << i), after)
                if key not in seen:
                    seen.add(key)
                    stack.append((entry, states))
                    states, linearized = after, key[0]
                    lift(entry)
                    if len(stack) > len(best):
                        best = tuple(opi[p] for p, _ in stack)
                        best_states = states
                    entry = nxt[head]
                    continue
                # an unknown call entering the pool as early as it can dominates every
                # order that takes it later: seen here means those were searched too
                back = unknown[i]
            if not back:
                entry = nxt[entry]
                continue
        # backtrack past unknown calls to the last known one, and try what follows it
        while True:
            if not stack:
                return Search("violation", best, best_states, len(seen))
            entry, states = stack.pop()
            linearized &= ~(1 << opi[entry])
            unlift(entry)
            if not unknown[opi[entry]]:
                break
        entry = nxt[entry]
    return Search("ok", tuple(opi[p] for p, _ in stack), states, len(seen))

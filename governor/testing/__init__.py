"""Checkers that stand outside governord's engine, and the seeded fuzzer that drives them.

`checks` audits emitted events and the engine's state against the spec's invariants and reads
a canonical form of the durable state; `fuzz` runs one seed of random operations with restarts
and replays, checking after every step (``python -m governor.testing.fuzz --seeds 0:40``);
`credit` is the ledger of credit blocks (C1-C4, docs/strict.md) and `creditfuzz` the fuzzer's
credit workers; `linearizability` checks recorded client histories of acquire, release,
consume, reserve/return credit and validate against a sequential model of governord (WGL,
Porcupine-style; docs/linearizability.md, ``python -m governor.testing.linearizability h.json``).
The tests and ``bench/governor_fuzz.py`` use them. Never imported by governor's engine, store,
server, client or authority (an import-linter contract says so).
"""

from governor.testing.checks import Auditor, Violation, canonical, check_state, first_diff

__all__ = ["Auditor", "Violation", "canonical", "check_state", "first_diff"]

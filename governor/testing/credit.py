"""The credit checks, from outside the engine: a ledger built from the emitted events alone
(blocks, their chains and expiries, returns, the history of each rate), then checked against
the engine's state and against what workers recorded spending.

* C1 level + outstanding <= B: for every rated bucket, its level plus the units of blocks the
  ledger holds live below it (granted, not returned, not expired) stays within the burst (a
  burst lowered below what is out leaves the level at 0); the bucket's own outstanding agrees.
* C2 no block spent after its expiry: every unit a worker admitted came from a block granted
  to it, before governord's expiry of the block and before its return was applied, and no
  block gave more than it held.
* C3 a return applies once, to a live block, never for more than the block.
* C4 the envelope: for every rate set once and never changed, the admissions at that node and
  below keep ``admitted(t0, t1) <= R * (t1 - t0) + B`` over every interval from then on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from governor.engine import Engine, Event, Rate
from governor.engine import _events as ev
from governor.engine._bucket import MILLI, level_at
from ratemesh.envelope import rate_excess

__all__ = ["CreditLedger", "CreditViolation"]

NS_PER_MS = 1_000_000


class CreditViolation(AssertionError):
    pass


@dataclass(slots=True)
class _Block:
    session_id: int
    resource: str
    units: int
    expires_ms: int
    chain: tuple[int, ...]  # the node and its ancestors at grant time, leaf first
    returned_ms: int | None = None
    spent: int = 0


@dataclass(slots=True)
class CreditLedger:
    blocks: dict[int, _Block] = field(default_factory=dict)
    parents: dict[int, int | None] = field(default_factory=lambda: {1: None})
    # (node, resource) -> (rate or None, since_ms, times set)
    rates: dict[tuple[int, str], tuple[Rate | None, int, int]] = field(default_factory=dict)
    admissions: list[tuple[int, int, str, int]] = field(default_factory=list)  # t, node, res, n
    granted: int = 0
    returned: int = 0

    # ---- from the events -----------------------------------------------------------------

    def on_event(self, engine: Engine, event: Event) -> None:
        """Right after ``event`` was applied to ``engine``."""
        if isinstance(event, ev.NodeCreated):
            self.parents[event.node_id] = event.parent_id
            for resource, rate in event.rates.items():
                self._rate(event.node_id, resource, rate, event.at_ms)
        elif isinstance(event, ev.RateSet):
            self._rate(event.node_id, event.resource, event.rate, event.at_ms)
        elif isinstance(event, ev.CreditGranted):
            self._granted(engine, event)
        elif isinstance(event, ev.CreditReturned):
            self._returned(event)

    def _rate(self, node: int, resource: str, rate: Rate | None, at_ms: int) -> None:
        times = self.rates.get((node, resource), (None, 0, 0))[2]
        self.rates[(node, resource)] = (rate, at_ms, times + 1)

    def _granted(self, engine: Engine, e: ev.CreditGranted) -> None:
        st = engine.state
        if e.block_id in self.blocks or e.units < 1 or e.expires_ms <= e.at_ms:
            raise CreditViolation(f"C3: a malformed or repeated grant: {e}")
        chain = tuple(n.id for n in st.chain(e.node_id))
        self.blocks[e.block_id] = _Block(e.session_id, e.resource, e.units, e.expires_ms, chain)
        self.granted += 1
        for node_id in chain:
            node = st.nodes[node_id]
            cap = node.quotas.get(e.resource)
            if cap is not None and node.used.get(e.resource, 0) > cap:
                raise CreditViolation(f"I1: credit took node {node_id} over its cap: {e}")
        self.check_buckets(engine, e.at_ms)

    def _returned(self, e: ev.CreditReturned) -> None:
        block = self.blocks.get(e.block_id)
        if block is None or block.returned_ms is not None:
            raise CreditViolation(f"C3: block {e.block_id} returned twice or never granted")
        if e.at_ms >= block.expires_ms or not 0 <= e.unused <= block.units:
            raise CreditViolation(f"C3: a return of an expired block or of too much: {e}")
        block.returned_ms = e.at_ms
        self.returned += 1

    def charged(self, resource: str, e: Event) -> int:
        """What ``e`` adds to the root's ``used`` of ``resource`` (I2 counts it)."""
        if isinstance(e, ev.CreditGranted) and e.resource == resource:
            return e.units
        if isinstance(e, ev.CreditReturned) and self.blocks[e.block_id].resource == resource:
            return -e.unused
        return 0

    # ---- against the engine's state ------------------------------------------------------

    def outstanding(self, node_id: int, resource: str, now_ms: int) -> int:
        return sum(
            b.units
            for b in self.blocks.values()
            if b.resource == resource
            and b.returned_ms is None
            and b.expires_ms > now_ms
            and node_id in b.chain
        )

    def check_buckets(self, engine: Engine, now_ms: int) -> None:
        """C1 for every rated bucket of the engine at ``now_ms``."""
        for (node_id, resource), bucket in sorted(engine.state.credit.buckets.items()):
            out = self.outstanding(node_id, resource, now_ms)
            if bucket.outstanding(now_ms) != out:
                raise CreditViolation(
                    f"C1: node {node_id} {resource}: the bucket counts "
                    f"{bucket.outstanding(now_ms)} outstanding, the grants say {out}"
                )
            level = level_at(bucket, max(now_ms, bucket.at_ms))
            burst = bucket.rate.burst
            if level < 0 or (level + out * MILLI > burst * MILLI and level != 0):
                raise CreditViolation(
                    f"C1: node {node_id} {resource}: level {level / MILLI} + outstanding "
                    f"{out} > burst {burst}"
                )

    # ---- against what workers spent ------------------------------------------------------

    def on_spend(self, now_ms: int, session_id: int, block_id: int, units: int) -> None:
        """C2: a worker admitted ``units`` from ``block_id`` at ``now_ms`` (governord's clock)."""
        block = self.blocks.get(block_id)
        if block is None or block.session_id != session_id:
            raise CreditViolation(f"C2: spent from block {block_id} never granted to it")
        if now_ms >= block.expires_ms:
            raise CreditViolation(
                f"C2: block {block_id} spent at {now_ms}, at or after its expiry {block.expires_ms}"
            )
        if block.returned_ms is not None and now_ms > block.returned_ms:  # same ms: ambiguous
            raise CreditViolation(f"C2: block {block_id} spent after its return was applied")
        block.spent += units
        if block.spent > block.units:
            raise CreditViolation(f"C2: block {block_id} gave {block.spent} of {block.units}")
        self.admissions.append((now_ms, block.chain[0], block.resource, units))

    def check_envelope(self) -> None:
        """C4 over the whole run, for every rate set once and never changed."""
        for (node_id, resource), (rate, since, times) in sorted(self.rates.items()):
            if rate is None or times != 1:
                continue
            admissions = [
                (t * NS_PER_MS, n, u)
                for t, n, r, u in self.admissions
                if r == resource and t >= since
            ]
            worst = rate_excess(admissions, self.parents, {node_id: (rate.per_s, rate.burst)})
            if worst[node_id] > 1e-6:
                raise CreditViolation(
                    f"C4: node {node_id} {resource} admitted {worst[node_id]:.3f} units more "
                    f"than {rate.per_s}/s * span + {rate.burst} over some interval"
                )

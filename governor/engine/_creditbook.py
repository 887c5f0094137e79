"""Credit blocks in the durable state: rated buckets, outstanding blocks, and how the credit
events change them. Called only from ``State.apply`` (and the snapshot loader), so a replay
computes exactly what the live engine did.

A block is charged like a consume to every node of its chain (``used``, so caps hold too) and
to every rated bucket on the chain; a return gives its unused units back to both, once. An
expired block stays charged to the caps (nobody knows how much of it was spent) and stops
counting in a bucket only from its expiry on (``_bucket.level_at``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _events as ev
from ._bucket import MILLI, Bucket, level_at
from ._types import BlockEnd, CreditGrant, CreditReturn, Edited, Rate

if TYPE_CHECKING:
    from ._state import State

__all__ = ["Block", "CreditBook", "dump_credit", "load_credit"]


@dataclass(slots=True)
class Block:
    id: int
    session_id: int
    node_id: int
    resource: str
    units: int
    granted_ms: int
    expires_ms: int
    returned: bool = False


@dataclass(slots=True)
class CreditBook:
    """Buckets by (node id, resource); blocks kept until they expire (so a second return
    answers a no-op); per session, the ids of its blocks not returned yet."""

    buckets: dict[tuple[int, str], Bucket] = field(default_factory=dict)
    blocks: dict[int, Block] = field(default_factory=dict)
    by_session: dict[int, set[int]] = field(default_factory=dict)

    # ---- the event handlers (through State.apply only) -----------------------------------

    def node_created(self, node_id: int, rates: dict[str, Rate], at_ms: int) -> None:
        for resource in sorted(rates):
            rate = rates[resource]
            self.buckets[(node_id, resource)] = Bucket(rate, rate.burst * MILLI, at_ms)

    def rate_set(self, st: State, e: ev.RateSet) -> None:
        st.remember(e.session_id, e.request, Edited(e.node_id))
        key = (e.node_id, e.resource)
        if e.rate is None:
            self.buckets.pop(key, None)
            return
        bucket = self.buckets.get(key)
        if bucket is None:
            # live blocks below the node count here from now on: a new rate takes effect
            # with what is already out, so level + outstanding <= B holds from the start
            bucket = self.buckets[key] = Bucket(e.rate, 0, e.at_ms)
            for block in self.blocks.values():
                if (
                    not block.returned
                    and block.resource == e.resource
                    and block.expires_ms > e.at_ms
                    and block.node_id in st.nodes
                    and any(n.id == e.node_id for n in st.chain(block.node_id))
                ):
                    bucket.blocks[block.id] = (block.units, block.expires_ms)
            level = e.rate.burst * MILLI
        else:
            level = _advance(bucket, e.at_ms)
            bucket.rate = e.rate
        room = (e.rate.burst - bucket.outstanding(e.at_ms)) * MILLI
        bucket.level_mu = max(0, min(level, room))  # a lowered burst takes nothing back

    def credit_granted(self, st: State, e: ev.CreditGranted) -> None:
        units = e.units
        for node in st.chain(e.node_id):
            node.used[e.resource] = node.used.get(e.resource, 0) + units
            bucket = self.buckets.get((node.id, e.resource))
            if bucket is not None:
                level = _advance(bucket, e.at_ms)
                bucket.level_mu = level - units * MILLI
                bucket.blocks[e.block_id] = (units, e.expires_ms)
                assert bucket.level_mu >= 0, "a grant never takes more than the level holds"
        target = st.nodes[e.node_id]
        target.direct[e.resource] = target.direct.get(e.resource, 0) + units
        self.blocks[e.block_id] = Block(
            e.block_id, e.session_id, e.node_id, e.resource, units, e.at_ms, e.expires_ms
        )
        self.by_session.setdefault(e.session_id, set()).add(e.block_id)
        st.next_id = max(st.next_id, e.block_id + 1)
        grant = CreditGrant(
            e.block_id, e.node_id, e.resource, units, e.expires_ms - e.at_ms, e.expires_ms
        )
        st.remember(e.session_id, e.request, grant)

    def credit_returned(self, st: State, e: ev.CreditReturned) -> None:
        block = self.blocks[e.block_id]
        assert not block.returned and block.expires_ms > e.at_ms, "a return applies once, live"
        assert 0 <= e.unused <= block.units
        block.returned = True
        self._unlist(block)
        for node in st.chain(block.node_id):
            node.used[block.resource] -= e.unused
            bucket = self.buckets.get((node.id, block.resource))
            if bucket is not None and block.id in bucket.blocks:
                level = _advance(bucket, e.at_ms)
                del bucket.blocks[block.id]
                room = (bucket.rate.burst - bucket.outstanding(e.at_ms)) * MILLI
                bucket.level_mu = min(level + e.unused * MILLI, max(level, room))
        st.nodes[block.node_id].direct[block.resource] -= e.unused
        st.remember(
            block.session_id, e.request, CreditReturn(e.block_id, e.unused, True, BlockEnd.RETURNED)
        )

    # ---- time (purges are a pure function of time, like tombstones) ----------------------

    def expire(self, block_id: int, now_ms: int) -> None:
        """Forget a block whose expiry has passed (its buckets fold it in lazily)."""
        block = self.blocks.get(block_id)
        if block is not None and block.expires_ms <= now_ms:
            del self.blocks[block_id]
            self._unlist(block)

    def forget_node(self, node_id: int) -> None:
        """A purged node's buckets go with it (it ended long before: nothing is granted there)."""
        for key in [k for k in self.buckets if k[0] == node_id]:
            del self.buckets[key]

    def _unlist(self, block: Block) -> None:
        ids = self.by_session.get(block.session_id)
        if ids is not None:
            ids.discard(block.id)
            if not ids:
                del self.by_session[block.session_id]


def _advance(bucket: Bucket, at_ms: int) -> int:
    """Bring a bucket to ``at_ms`` before an event changes it: its level then, and blocks
    expired by then dropped (they no longer bound the refill)."""
    level = level_at(bucket, at_ms)
    for block_id in [b for b, (_, exp) in bucket.blocks.items() if exp <= at_ms]:
        del bucket.blocks[block_id]
    bucket.at_ms = max(bucket.at_ms, at_ms)
    return level


def dump_credit(book: CreditBook) -> dict[str, Any]:
    """The book as JSON-able data for a snapshot (sorted, so equal books dump equal)."""
    return {
        "buckets": [
            [
                node_id,
                resource,
                b.rate.per_s,
                b.rate.burst,
                b.level_mu,
                b.at_ms,
                [[i, u, x] for i, (u, x) in sorted(b.blocks.items())],
            ]
            for (node_id, resource), b in sorted(book.buckets.items())
        ],
        "blocks": [
            [b.id, b.session_id, b.node_id, b.resource, b.units, b.granted_ms, b.expires_ms]
            + [b.returned]
            for _, b in sorted(book.blocks.items())
        ],
    }


def load_credit(data: dict[str, Any]) -> CreditBook:
    book = CreditBook()
    for node_id, resource, per_s, burst, level_mu, at_ms, blocks in data["buckets"]:
        book.buckets[(int(node_id), str(resource))] = Bucket(
            Rate(int(per_s), int(burst)),
            int(level_mu),
            int(at_ms),
            {int(i): (int(u), int(x)) for i, u, x in blocks},
        )
    for raw in data["blocks"]:
        bid, sid, node_id, resource, units, granted_ms, expires_ms, returned = raw
        block = Block(
            int(bid),
            int(sid),
            int(node_id),
            str(resource),
            int(units),
            int(granted_ms),
            int(expires_ms),
            bool(returned),
        )
        book.blocks[block.id] = block
        if not block.returned:
            book.by_session.setdefault(block.session_id, set()).add(block.id)
    return book

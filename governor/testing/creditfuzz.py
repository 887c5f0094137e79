"""The fuzzer's credit workers: each (session, node, resource) a worker holds a
``ratemesh.credit.CreditHolder`` for, driven against the engine with delays both ways, lost
replies, duplicate returns and restarts in between. Every unit a worker admits is handed to
the auditor's ``CreditLedger`` (C2, C4); the worker's clock is governord's (rho covers none of
the delays, so only timing from the send keeps a worker inside a block's life).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from governor.engine import (
    CreditGrant,
    Denial,
    Engine,
    ManualClock,
    NotFound,
    Rate,
    SessionEnded,
)
from governor.testing.credit import CreditLedger
from ratemesh.credit import CreditConfig, CreditHolder, Reserve

__all__ = ["CreditWorkers", "random_rates"]

HOLDERS_MAX = 64
DELAYS_MS = (0, 0, 1, 10, 100, 400)
WORKER = CreditConfig(rho_ppm=1_000, epsilon_ms=0, idle_ms=3_000, blocks_max=8)


def random_rates(rng: random.Random, resources: tuple[str, ...]) -> dict[str, Rate]:
    """Some rates, often none: R in {0, 5, 50, 400} per second, B in [1, 60]."""
    return {
        r: Rate(rng.choice([0, 5, 50, 400]), rng.randint(1, 60))
        for r in resources
        if rng.random() < 0.4
    }


class CreditWorkers:
    def __init__(
        self,
        rng: random.Random,
        clock: ManualClock,
        engine: Callable[[], Engine],
        ledger: Callable[[], CreditLedger],
    ) -> None:
        self.rng = rng
        self.clock = clock
        self.engine = engine
        self.ledger = ledger
        self.holders: dict[tuple[int, int, str], CreditHolder] = {}

    def _delay(self) -> None:
        self.clock.advance(self.rng.choice(DELAYS_MS))

    def pick(self, sid: int, nodes: list[int], resources: tuple[str, ...]) -> tuple[int, int, str]:
        """Mostly a holder of this session's; workers of sessions gone and holding nothing
        leave first (a worker of a lapsed session still spends what it holds)."""
        now = self.clock.now_ms()
        live = self.engine().state.nodes
        for key in sorted(self.holders):
            holder = self.holders[key]
            node = live.get(key[1])
            gone = key[0] != sid or node is None or node.state.terminal
            if gone and holder.in_flight is None and holder.held(now) == 0:
                if self.rng.random() < 0.5:
                    del self.holders[key]
        nodes = [n for n in nodes if n in live and not live[n].state.terminal] or nodes
        mine = sorted(k for k in self.holders if k[0] == sid)
        if mine and (self.rng.random() < 0.8 or len(self.holders) >= HOLDERS_MAX):
            return self.rng.choice(mine)
        if len(self.holders) >= HOLDERS_MAX:
            return self.rng.choice(sorted(self.holders))
        key = (sid, self.rng.choice(nodes), self.rng.choice(resources))
        self.holders.setdefault(key, CreditHolder(WORKER))
        return key

    def spend(self, key: tuple[int, int, str]) -> None:
        """A short stream of admissions, the clock moving a little between them."""
        holder = self.holders[key]
        if self.rng.random() < 0.2:  # the riskiest moment: a block's last local millisecond
            now = self.clock.now_ms()
            last = max((b.expires_at_ms for b in holder.blocks.values() if b.left), default=now)
            self.clock.advance(max(0, last - 1 - now))
        for _ in range(self.rng.randint(1, 8)):
            now = self.clock.now_ms()
            verdict = holder.try_spend(now, self.rng.randint(1, 4))
            for block_id, units in verdict.taken:
                self.ledger().on_spend(now, key[0], block_id, units)
            self.clock.advance(self.rng.choice((0, 1, 5, 20)))

    def reserve(self, key: tuple[int, int, str]) -> None:
        holder = self.holders[key]
        now = self.clock.now_ms()
        request = holder.refill(now) or holder.begin(now, self.rng.randint(1, 30))
        if request is None:
            return
        self._delay()  # the request travels
        sid, node, resource = key
        try:
            got = self.engine().reserve_credit(sid, node, resource, request.units)
        except (SessionEnded, NotFound):
            holder.failed(request, unreachable=False)
            return
        self._delay()  # the reply travels
        if isinstance(got, Denial):
            holder.failed(request, unreachable=False)
        elif self.rng.random() < 0.1:  # the reply is lost: the block is stranded, not spent
            holder.failed(request, unreachable=True)
        else:
            assert isinstance(got, CreditGrant)
            self.grant(holder, request, got)

    def grant(self, holder: CreditHolder, request: Reserve, got: CreditGrant) -> None:
        holder.granted(self.clock.now_ms(), request, got.block_id, got.units, got.ttl_ms)

    def give_back(self, key: tuple[int, int, str]) -> None:
        holder = self.holders[key]
        returns = holder.take_returns(self.clock.now_ms(), leaving=self.rng.random() < 0.2)
        for block_id, unused in returns:
            self._delay()
            for _ in range(2 if self.rng.random() < 0.2 else 1):  # a duplicate return too
                try:
                    self.engine().return_credit(key[0], block_id, unused)
                except SessionEnded:
                    break
        if not holder.blocks and holder.in_flight is None and self.rng.random() < 0.3:
            del self.holders[key]  # the worker leaves

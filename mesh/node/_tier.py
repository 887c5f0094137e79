"""Spend quotas' shared cell tier (docs/quotas.md): our cells written to it, its folds read.

Cells to write wait here, newest burn per (key, period), for one task that calls the tier
off the loop and folds each answer into the ledger (remote = max(owner fold, tier fold)).
The pending map is bounded by the ledger's keys (QUOTA_KEYS_MAX). The tier is best effort
beside the owners: a failed call is counted (`tier_errors`) and the owners' folds stand.

`forget_member` decommissions a replica by name (`mesh fleet forget-member`): its cells go
from the folds this node owns and from the tier, so a replica back under a new id stops
counting its burn twice at once instead of after the retention window.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import Any

from mesh.core.member import Member
from mesh.core.messages import CellPublish
from mesh.core.policy import RateKey
from mesh.core.quota import CellTier
from mesh.errors import ConfigError

__all__ = ["CellTierWriter"]

log = logging.getLogger("mesh.node")


class CellTierWriter:
    """Our published cells, to the tier (`cell_tier`; None: the owners' folds alone).
    `spawn` starts the writing task at first use, as one of the node's tasks."""

    def __init__(
        self,
        member: Member,
        lock: AbstractContextManager[Any],
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
    ) -> None:
        self.member = member
        self.lock = lock
        self.spawn = spawn
        self.cell_tier: CellTier | None = None  # set any time before the first publish
        self.closing = False  # the node is leaving: no task is started any more
        self._pending: dict[tuple[RateKey, int], int] = {}
        self._wake = asyncio.Event()
        self._running = False  # the task that calls the tier, started at first use
        self.tier_errors = 0
        self.tier_folds = 0  # tier answers folded into the ledger

    def publish(self, msg: CellPublish) -> None:
        """Our cells went out to their owners: write them to the tier too (if there is one)."""
        if self.cell_tier is None:
            return
        for c in msg.cells:
            self._pending[(c.rate_key, c.period_index)] = c.burn
        if not self._running and self.member.quotas is not None and not self.closing:
            self._running = True  # one task for the node's life
            self.spawn(self._run(), "mesh-cell-tier")
        self._wake.set()

    async def forget_member(self, name: str) -> dict[str, Any]:
        """Purge `name`'s cells here (the folds we own) and in the tier; the counts. A
        failing tier is said in `tier_error`, the folds purged either way."""
        if name == self.member.member_id:
            raise ConfigError("member", f"{name!r} is this member: ask another one")
        quotas = self.member.quotas
        with self.lock:
            folds = 0 if quotas is None else quotas.folds.forget_member(name)
        out: dict[str, Any] = {"member_id": self.member.member_id, "folds_cells": folds}
        tier = self.cell_tier
        if tier is not None:
            loop = asyncio.get_running_loop()
            try:
                out["tier_cells"] = await loop.run_in_executor(None, tier.forget_member, name)
            except Exception as exc:  # noqa: BLE001 - said in the answer, counted
                self.tier_errors += 1
                out["tier_error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        log.warning(
            "forgot member %s: %d fold cells, %s tier cells",
            name,
            folds,
            out.get("tier_cells", "no"),
        )
        return out

    async def _run(self) -> None:
        """Write the pending cells to the tier, one blocking call at a time in a thread,
        and fold each answer into the ledger."""
        tier, quotas = self.cell_tier, self.member.quotas
        assert tier is not None and quotas is not None
        loop = asyncio.get_running_loop()
        member_id = self.member.member_id
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                (key, index), burn = self._pending.popitem()
                now_ms = quotas.wall_ms()
                try:
                    cells = await loop.run_in_executor(
                        None, tier.exchange, now_ms, key, index, member_id, burn
                    )
                except Exception as exc:  # noqa: BLE001 - the tier is best effort beside the owners
                    self.tier_errors += 1
                    log.debug("cell tier: %s", exc)
                    continue
                with self.lock:
                    quotas.ledger.tier_folded(quotas.wall_ms(), key, index, cells)
                self.tier_folds += 1

"""Credit-block calls (docs/strict.md): reserve a block, return its unused units, set a rate."""

from __future__ import annotations

from typing import Any

import grpc

from governor.engine import CreditGrant, CreditReturn, Denial, Rate

from ._calls import Impl, Principal, Steps
from ._status import Fail, denial_fail

__all__ = ["CreditCalls"]


class CreditCalls:
    def __init__(self, steps: Steps) -> None:
        self._steps = steps

    def calls(self) -> dict[str, Impl]:
        return {
            "ReserveCredit": self.reserve_credit,
            "ReturnCredit": self.return_credit,
            "SetRate": self.set_rate,
        }

    async def reserve_credit(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        """A credit block, logged before this reply; the worker times it from its send."""
        assert who is not None
        result = await self._steps.step(
            lambda e: e.reserve_credit(
                who.session_id,
                b["node_id"],
                b["resource"],
                b["units"],
                request_id=b["request_id"],
            )
        )
        if isinstance(result, Denial):
            raise denial_fail(result)
        assert isinstance(result, CreditGrant)
        return {
            "block_id": result.block_id,
            "node_id": result.node_id,
            "resource": result.resource,
            "units": result.units,
            "ttl_ms": result.ttl_ms,
            "expires_ms": result.expires_ms,
        }

    async def return_credit(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        """Unused units back, once per block id; a second return is a no-op answer."""
        assert who is not None
        result = await self._steps.step(
            lambda e: e.return_credit(
                who.session_id, b["block_id"], b["unused"], request_id=b["request_id"]
            )
        )
        assert isinstance(result, CreditReturn)
        return {
            "block_id": result.block_id,
            "returned": result.applied,
            "end": result.end.value,
        }

    async def set_rate(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        sid = who.session_id
        if (b["per_s"] is None) != (b["burst"] is None):
            field = "burst" if b["burst"] is None else "per_s"
            raise Fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                "invalid_argument",
                f"{field}: per_s and burst come together (both nil removes the rate)",
                field=field,
            )
        rate = None if b["per_s"] is None else Rate(b["per_s"], b["burst"])
        return await self._steps.edit(
            lambda e: e.set_rate(sid, b["node_id"], b["resource"], rate, b["request_id"])
        )

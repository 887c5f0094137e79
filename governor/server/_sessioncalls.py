"""Session and lease calls: open, heartbeat, close; acquire (through the fair queue), release,
validate."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import grpc

from governor.config import GovernordConfig
from governor.engine import Denial, Granted, LeaseEnd, LeaseStatus, Queued, Released

from ._calls import Impl, Principal, Steps
from ._status import Fail, denial_fail, sha256_hex

__all__ = ["SessionCalls"]


class SessionCalls:
    def __init__(self, steps: Steps, config: GovernordConfig) -> None:
        self._steps = steps
        self._config = config

    def calls(self) -> dict[str, Impl]:
        return {
            "OpenSession": self.open_session,
            "Heartbeat": self.heartbeat,
            "CloseSession": self.close_session,
            "Acquire": self.acquire,
            "Release": self.release,
            "Validate": self.validate,
        }

    async def open_session(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        cfg = self._config
        ttl = b["ttl_ms"] or cfg.session_ttl_ms
        if not cfg.session_ttl_min_ms <= ttl <= cfg.session_ttl_max_ms:
            raise Fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                "invalid_argument",
                f"ttl_ms: must lie in [{cfg.session_ttl_min_ms}, {cfg.session_ttl_max_ms}]",
                field="ttl_ms",
            )
        token = secrets.token_urlsafe(32)  # 256 random bits; only its SHA-256 is stored
        sid, expires = await self._steps.step(
            lambda e: e.open_session(who.scope_id, ttl, sha256_hex(token))
        )
        return {
            "session_id": sid,
            "token": token,
            "expires_ms": expires,
            "ttl_ms": ttl,
            "scope_id": who.scope_id,
            "tenant": who.tenant,
        }

    async def heartbeat(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        expires = await self._steps.step(lambda e: e.heartbeat(who.session_id))
        return {"expires_ms": expires}

    async def close_session(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        await self._steps.step(lambda e: e.close_session(who.session_id))
        return {}

    async def acquire(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        """Wait in the fair queue; a cancelled call leaves no lease behind."""
        assert who is not None
        sid = who.session_id
        result = await self._steps.step(
            lambda e: e.acquire(sid, b["node_id"], b["cls"], request_id=b["request_id"])
        )
        if isinstance(result, Queued):
            result = await self._wait_grant(sid, result.waiter_id, b["timeout_ms"])
        if isinstance(result, Denial):
            raise denial_fail(result)
        assert isinstance(result, Granted)
        return {"lease_id": result.lease_id, "node_id": result.node_id, "cls": result.cls}

    async def _wait_grant(self, sid: int, waiter_id: int, timeout_ms: int | None) -> Any:
        steps = self._steps
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        try:
            while True:
                changed = steps.changed
                outcome = await steps.step(lambda e: e.take_outcome(sid, waiter_id))
                if outcome is not None:
                    return outcome
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError
                try:
                    await asyncio.wait_for(changed.wait(), min(remaining or 1.0, 1.0))
                except TimeoutError:
                    pass
        except TimeoutError:
            await steps.step(lambda e: e.cancel_wait(sid, waiter_id))
            raise Fail(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "timeout",
                f"no lease within timeout_ms={timeout_ms}",
            ) from None
        except asyncio.CancelledError:
            steps.authority.step(lambda e: e.cancel_wait(sid, waiter_id))
            raise

    async def release(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        assert who is not None
        result = await self._steps.step(
            lambda e: e.release(
                who.session_id,
                b["lease_id"],
                latency_ms=b["latency_ms"],
                overloaded=bool(b["overloaded"]),
                request_id=b["request_id"],
            )
        )
        assert isinstance(result, Released)
        if not result.by_this_call and result.end is not LeaseEnd.RELEASED:
            raise Fail(
                grpc.StatusCode.FAILED_PRECONDITION,
                "lease_ended",
                f"lease {result.lease_id} ended before this release: {result.end.value}",
                end=result.end.value,
                lease_id=result.lease_id,
            )
        return {"lease_id": result.lease_id, "released": result.by_this_call}

    async def validate(self, who: Principal | None, b: dict[str, Any]) -> dict[str, Any]:
        status = await self._steps.step(lambda e: e.validate(b["lease_id"]))
        assert isinstance(status, LeaseStatus)  # the step confirmed the epoch: a read
        return {
            "lease_id": status.lease_id,
            "live": status.live,
            "end": None if status.end is None else status.end.value,
        }

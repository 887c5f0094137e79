"""The coordinator as a worker sees it: list every current policy, or watch for changes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from mesh.core.policy import TenantRatePolicy
from mesh.errors import MessageError

__all__ = ["PolicySnapshot", "PolicySource"]


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """Every generation the coordinator holds, as of `revision` (grows with each put)."""

    revision: int
    policies: tuple[TenantRatePolicy, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"revision": self.revision, "policies": [p.to_dict() for p in self.policies]}

    @classmethod
    def from_wire(cls, obj: Any) -> PolicySnapshot:
        if not isinstance(obj, dict) or not isinstance(obj.get("policies"), list):
            raise MessageError("policies", "must be {revision, policies: [...]}")
        rev = obj.get("revision")
        if type(rev) is not int or rev < 0:
            raise MessageError("revision", "must be an integer >= 0")
        return cls(
            rev,
            tuple(
                TenantRatePolicy.from_dict(p, where=f"policies[{i}]", error=MessageError)
                for i, p in enumerate(obj["policies"])
            ),
        )


class PolicySource(Protocol):
    """Implemented by the in-process `PolicyStore` and by the gRPC `CoordinatorClient`.
    Failures raise `PeerError` (unreachable) or `MessageError` (a bad answer)."""

    async def list(self) -> PolicySnapshot: ...

    def watch(self, after_revision: int) -> AsyncIterator[PolicySnapshot]:
        """Yield a snapshot whenever the revision passes `after_revision`, until cancelled."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

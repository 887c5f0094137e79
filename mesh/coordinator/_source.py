"""The coordinator as a worker sees it: list every current policy, or watch for changes.

The snapshot's wire shape is shared with governord (`ratemesh.coordinator`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from ratemesh.coordinator import PolicySnapshot, Tombstone

__all__ = ["PolicySnapshot", "PolicySource", "Tombstone"]


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

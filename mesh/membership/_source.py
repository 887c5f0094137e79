"""What a membership source reports, and the Protocol every source implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["MembershipView", "MembershipSource", "Publish"]


@dataclass(frozen=True, slots=True)
class MembershipView:
    """The live members (id -> peer address), the ring epoch every member agrees on, and
    whether the source is unreachable (then this is the last view it gave: kept, but stale)."""

    members: dict[str, str] = field(default_factory=dict)
    epoch: int = 0
    stale: bool = False


Publish = Callable[[MembershipView], None]


class MembershipSource(Protocol):
    async def run(self, publish: Publish) -> None:
        """Join, then publish every change until cancelled (never returns on its own)."""
        ...

    async def leave(self) -> None:
        """Leave the ring now (graceful stop), bounded in time, best effort."""
        ...

    async def close(self) -> None:
        """Release connections (after `run` was cancelled)."""
        ...

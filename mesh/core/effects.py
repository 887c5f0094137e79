"""What the sans-I/O cores ask their driver to do. Imperative, frozen, and plain."""

from __future__ import annotations

from dataclasses import dataclass

from mesh.core.messages import Message
from mesh.core.policy import RateKey

__all__ = ["Send", "FetchPolicy", "Effect"]


@dataclass(frozen=True, slots=True)
class Send:
    """Deliver `message` to member `to` (best effort; the protocol tolerates loss)."""

    to: str
    message: Message


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    """Obtain this exact generation from the coordinator, then call `policy_learned`."""

    rate_key: RateKey


Effect = Send | FetchPolicy

"""What the sans-I/O cores ask their driver to do. Imperative, frozen, and plain."""

from __future__ import annotations

from dataclasses import dataclass

from mesh.core.messages import Message
from mesh.core.policy import RateKey
from ratemesh.credit import Reserve

__all__ = ["Send", "FetchPolicy", "ReserveCredit", "ReturnCredit", "Effect"]


@dataclass(frozen=True, slots=True)
class Send:
    """Deliver `message` to member `to` (best effort; the protocol tolerates loss)."""

    to: str
    message: Message


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    """Obtain this exact generation from the coordinator, then call `policy_learned`."""

    rate_key: RateKey


@dataclass(frozen=True, slots=True)
class ReserveCredit:
    """Ask governord for a credit block for a strict limit (`Reserve.sent_at_ms` is already
    set: send now), then call `CreditDesk.granted` or `.failed` with this same object."""

    rate_key: RateKey
    request: Reserve


@dataclass(frozen=True, slots=True)
class ReturnCredit:
    """Give back a block's unused units (already out of the holder: nothing spends them)."""

    rate_key: RateKey
    block_id: int
    unused: int


Effect = Send | FetchPolicy | ReserveCredit | ReturnCredit

"""The fleet-wide 429 cooldown on the wire (docs/cooldown.md): a worker's
`CooldownReport` to a key's owner ("the service behind this limit said 429: back off"),
and the owner's `CooldownNotice` to the key's reporters (how long is left).

Both are bounded before anything keys a map by them: rows per message, and a duration of
at most COOLDOWN_MS_MAX. The sender of a report is the stream's authenticated member.
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh.core._validate import check_int, check_str
from mesh.core.policy import RateKey
from mesh.errors import MessageError, MessageTypeError

__all__ = [
    "COOLDOWN_MS_MAX",
    "COOLDOWN_ROWS_MAX",
    "CooldownRow",
    "CooldownReport",
    "CooldownNotice",
]

COOLDOWN_MS_MAX = 3_600_000  # an hour: a back-off, not an off switch (a policy is that)
COOLDOWN_ROWS_MAX = 256  # rows in one message, as CELL_ROWS_MAX


@dataclass(frozen=True, slots=True)
class CooldownRow:
    """`rate_key` backs off for `ms` (a report: how long was asked; a notice: what is left)."""

    rate_key: RateKey
    ms: int

    def __post_init__(self) -> None:
        if type(self.rate_key) is not RateKey:
            raise MessageTypeError("rate_key", "must be a RateKey")
        check_int("ms", self.ms, minimum=1, maximum=COOLDOWN_MS_MAX, error=MessageError)


def _check(sender: object, ring_epoch: object, rows: object) -> None:
    check_str("sender", sender, error=MessageError)
    check_int("ring_epoch", ring_epoch, error=MessageError)
    if type(rows) is not tuple:
        raise MessageTypeError("rows", "must be a tuple of CooldownRow")
    if len(rows) > COOLDOWN_ROWS_MAX:
        raise MessageError("rows", f"at most {COOLDOWN_ROWS_MAX} per message, got {len(rows)}")
    for i, r in enumerate(rows):
        if not isinstance(r, CooldownRow):
            raise MessageTypeError(f"rows[{i}]", "must be a CooldownRow")


@dataclass(frozen=True, slots=True)
class CooldownReport:
    """A worker saw a 429 for these keys: to each key's owner."""

    sender: str
    ring_epoch: int
    rows: tuple[CooldownRow, ...]

    def __post_init__(self) -> None:
        _check(self.sender, self.ring_epoch, self.rows)


@dataclass(frozen=True, slots=True)
class CooldownNotice:
    """An owner's word to a reporter: these keys are cooling down for `ms` more."""

    sender: str
    ring_epoch: int
    rows: tuple[CooldownRow, ...]

    def __post_init__(self) -> None:
        _check(self.sender, self.ring_epoch, self.rows)

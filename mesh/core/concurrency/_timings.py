"""The global mode's clocks and bounds, checked once."""

from __future__ import annotations

from dataclasses import dataclass

from ratemesh.checks import check_int
from ratemesh.errors import ConfigError

__all__ = ["SlotTimings", "usable_ms"]


@dataclass(frozen=True, slots=True)
class SlotTimings:
    """`lease_ttl_ms`: how long a grant lets a worker admit, from when it sent the report
    the grant answers (it stops at 7/8 of it, the margin for clock-rate drift).
    `member_ttl_ms`: how long an owner counts a member's holdings with no report from it; a
    crashed worker's slots come back after it. `keys_max`, `leases_max`, `members_max`: the
    named bounds of the maps each side keeps."""

    lease_ttl_ms: int = 100
    member_ttl_ms: int = 1_000
    keys_max: int = 65_536
    leases_max: int = 1 << 20
    members_max: int = 4_096

    def __post_init__(self) -> None:
        check_int("lease_ttl_ms", self.lease_ttl_ms, minimum=8, maximum=600_000)
        check_int("member_ttl_ms", self.member_ttl_ms, minimum=1, maximum=3_600_000)
        if self.member_ttl_ms < self.lease_ttl_ms:
            raise ConfigError(
                "member_ttl_ms",
                f"must be >= lease_ttl_ms ({self.lease_ttl_ms}): a member is dropped only "
                "after its grants ran out",
            )
        for name in ("keys_max", "leases_max", "members_max"):
            check_int(name, getattr(self, name), minimum=1)

    @property
    def usable_ms(self) -> int:
        """The part of a lease a worker spends: 7/8, the rest a margin for drift."""
        return usable_ms(self.lease_ttl_ms)


def usable_ms(lease_ttl_ms: int) -> int:
    """7/8 of a lease: the part a worker spends, the rest a margin for clock-rate drift."""
    return lease_ttl_ms * 7 // 8

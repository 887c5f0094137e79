"""The metrics a policy can limit, their units, and the coordination modes."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Metric", "Unit", "Mode", "BOUNDS"]


class Unit(StrEnum):
    UNITS = "units"  # requests (IOPS): one admission is one unit
    BYTES = "bytes"  # transfer: admissions are charged per chunk


class Metric(StrEnum):
    """Seed 004's metrics. A StrEnum so a member hashes and compares like its name."""

    READ_IOPS = "read_iops"
    CLIENT_EGRESS_BYTES = "client_egress_bytes"
    ORIGIN_READ_BYTES = "origin_read_bytes"
    WRITE_IOPS = "write_iops"
    CLIENT_INGRESS_BYTES = "client_ingress_bytes"
    ORIGIN_WRITE_BYTES = "origin_write_bytes"

    @property
    def unit(self) -> Unit:
        return _UNITS[self]


_UNITS = {m: Unit.BYTES if m.value.endswith("_bytes") else Unit.UNITS for m in Metric}


class Mode(StrEnum):
    """How far a limit is coordinated (seed 002), each with the bound it discloses."""

    LOCAL = "local"
    SHARE = "share"
    GLOBAL = "global"
    STRICT = "strict"


# Fixed, machine-readable bound strings: shown on /health and carried by every verdict.
BOUNDS: dict[str, str] = {
    "local": "fleet<=N*limit",
    "share": "fleet<=N*ceil(limit/N_live)",
    "share_stale": "membership_stale:N=1;fleet<=N*limit",
    "global": "excess<=N*b+R*d",
    "global_stale": "excess<=N*b+R*d;stale_view_restricted",
    # Cut off from the owner: the view spends only its floor, R/members for a bounded span,
    # escrowed by the owner (docs/partitions.md).
    "global_floor": "excess<=N*b+R*d;owner_unreachable=>floor_R/N_escrowed",
    "strict": "never_exceeds;unreachable=>fail_closed",
    "disabled": "unlimited:policy_disabled",
    "unknown": "policy_unknown:fail_closed",
}

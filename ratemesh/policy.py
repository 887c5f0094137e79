"""The one policy model both planes use (issue 13): TenantRatePolicy, the metrics and modes it
names, and RateKey, the key each limit is metered under.

The mesh meters a policy; governord stores its generations durably and hands them to the
nodes. Both import it from here, so a generation means the same thing on both sides. A bad
value raises `ratemesh.errors.ConfigError` naming the field (`from_dict` re-homes it in the
family its caller names: the mesh's `ConfigError`, or `MessageError` for a peer's message).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from ratemesh.checks import check_bool, check_choice, check_int, check_str, rename
from ratemesh.errors import ConfigError, RatemeshError

__all__ = [
    "DEFAULT_TENANT",
    "POLICY_FIELDS",
    "Metric",
    "Mode",
    "RateKey",
    "TenantRatePolicy",
    "Unit",
]


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


# A policy for this tenant id applies to every tenant that has no policy of its own; each
# tenant still gets its own RateKey and its own bucket.
DEFAULT_TENANT = "*"


class RateKey(NamedTuple):
    """(tenant_id, metric, policy_generation): one independently metered limit.

    A NamedTuple rather than a dataclass: it is a dict key on the owner's and reporter's
    paths, and tuple hashing is done in C.
    """

    tenant_id: str
    metric: Metric
    policy_generation: int

    def ring_token(self) -> str:
        """The string the consistent-hash ring places; stable across processes."""
        return f"{self.tenant_id}\x1f{self.metric.value}\x1f{self.policy_generation}"


@dataclass(frozen=True, slots=True)
class TenantRatePolicy:
    """One immutable generation of a tenant's limit on one metric (seed 004).

    `target_rate` is R in units (or bytes) per second, `global_burst` is B, and
    `local_burst_cap` is b, the most one worker may spend ahead of its owner's view.
    """

    tenant_id: str
    metric: Metric
    generation: int
    target_rate: int
    global_burst: int
    local_burst_cap: int
    enabled: bool = True
    mode: Mode = Mode.GLOBAL
    _key: RateKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_str("tenant_id", self.tenant_id)
        object.__setattr__(self, "metric", _metric(self.metric))
        check_int("generation", self.generation, minimum=1)
        check_int("target_rate", self.target_rate, minimum=1)
        check_int("global_burst", self.global_burst, minimum=1)
        check_int("local_burst_cap", self.local_burst_cap, minimum=1)
        check_bool("enabled", self.enabled)
        object.__setattr__(self, "mode", _mode(self.mode))
        # Built once: views and owners key dicts by it, and each copy would cost memory.
        object.__setattr__(self, "_key", RateKey(self.tenant_id, self.metric, self.generation))

    @property
    def rate_key(self) -> RateKey:
        return self._key

    def for_tenant(self, tenant_id: str) -> TenantRatePolicy:
        """This default policy as it applies to one concrete tenant."""
        if tenant_id == self.tenant_id:
            return self
        return TenantRatePolicy(
            tenant_id,
            self.metric,
            self.generation,
            self.target_rate,
            self.global_burst,
            self.local_burst_cap,
            self.enabled,
            self.mode,
        )

    def values(self) -> tuple[object, ...]:
        """What the policy says, without its generation: two generations with equal values
        are the same limit (a re-apply of unchanged values is no change)."""
        return (
            self.target_rate,
            self.global_burst,
            self.local_burst_cap,
            self.enabled,
            self.mode,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "metric": self.metric.value,
            "generation": self.generation,
            "target_rate": self.target_rate,
            "global_burst": self.global_burst,
            "local_burst_cap": self.local_burst_cap,
            "enabled": self.enabled,
            "mode": self.mode.value,
        }

    @classmethod
    def from_dict(
        cls,
        data: Any,
        *,
        where: str = "policy",
        error: type[RatemeshError] = ConfigError,
    ) -> TenantRatePolicy:
        """Build from a mapping (YAML, coordinator), naming `where.key` in any error."""
        if not isinstance(data, dict):
            raise error(where, f"must be a mapping, got {type(data).__name__}")
        required = _REQUIRED
        unknown = sorted(set(map(str, data)) - set(POLICY_FIELDS))
        if unknown:
            raise error(f"{where}.{unknown[0]}", "unknown key")
        for name in required:
            if name not in data:
                raise error(f"{where}.{name}", "is required")
        try:
            return cls(**data)
        except RatemeshError as exc:
            raise rename(exc, where, error) from exc


_METRICS = {m.value: m for m in Metric}
_MODES = {m.value: m for m in Mode}
_REQUIRED = (
    "tenant_id",
    "metric",
    "generation",
    "target_rate",
    "global_burst",
    "local_burst_cap",
)
# Every key a policy mapping may carry (YAML files, the coordinator's wire, governord's log).
POLICY_FIELDS = (*_REQUIRED, "enabled", "mode")


def _metric(value: Any) -> Metric:
    if isinstance(value, Metric):
        return value
    return check_choice("metric", value, _METRICS)  # type: ignore[no-any-return]


def _mode(value: Any) -> Mode:
    if isinstance(value, Mode):
        return value
    return check_choice("mode", value, _MODES)  # type: ignore[no-any-return]

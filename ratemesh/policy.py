"""The one policy model both planes use: TenantRatePolicy, the metrics and modes it
names, and RateKey, the key each limit is metered under.

An open vocabulary: a metric is any name that `METRIC_NAME` matches, declared by
the policies that name it, each with a `Unit` (requests, bytes, tokens, usd_micros; one
unit per metric across all policies). Seed 004's six names stay as the `Metric` constants,
and a policy that names no unit gets the one its name implies (`*_bytes`: bytes, else
requests), so old files and governord logs load unchanged. Rates and bursts may be written
as text (`ratemesh.rates`). A policy may name a descriptor under its tenant, Envoy style
(`descriptor: {route: /upload}`); it is folded into the RateKey's tenant part
(`descriptor_tenant`), so owners, reporters, the ring and the wire need no new field.

The mesh meters a policy; governord stores its generations durably and hands them to the
nodes. Both import it from here, so a generation means the same thing on both sides. A bad
value raises `ratemesh.errors.ConfigError` naming the field (`from_dict` re-homes it in the
family its caller names: the mesh's `ConfigError`, or `MessageError` for a peer's message).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from ratemesh.checks import INT_MAX, check_bool, check_choice, check_int, check_str, rename
from ratemesh.errors import ConfigError, RatemeshError
from ratemesh.rates import parse_amount, parse_rate, rate_text

__all__ = [
    "DEFAULT_TENANT",
    "DESCRIPTOR_SEP",
    "DESCRIPTOR_WILDCARD",
    "METRIC_NAME",
    "METRICS_MAX",
    "POLICY_FIELDS",
    "Descriptor",
    "Metric",
    "Mode",
    "Period",
    "Posture",
    "RateKey",
    "TenantRatePolicy",
    "Unit",
    "check_metric",
    "check_units",
    "default_unit",
    "descriptor_tenant",
    "scope_name",
    "split_tenant",
]


class Unit(StrEnum):
    """What one unit of a metric counts. "units", the old name of requests, is read as it."""

    REQUESTS = "requests"  # requests (IOPS): one admission is one unit
    BYTES = "bytes"  # transfer: admissions are charged per chunk
    TOKENS = "tokens"  # model tokens, charged per call and refunded when fewer were used
    USD_MICROS = "usd_micros"  # spend, in millionths of a US dollar
    UNITS = "requests"  # alias (the older name): Unit.UNITS is Unit.REQUESTS

    @classmethod
    def _missing_(cls, value: object) -> Unit | None:
        return cls.REQUESTS if value == "units" else None


# Units charged ahead and refunded when fewer were used (a short send, a shorter reply).
_REFUNDED = frozenset({Unit.BYTES, Unit.TOKENS})


# The one rule a metric name must follow: it is a label value, a wire string and a file key.
METRIC_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
# Distinct metric names one policy cache (one node, one governord) holds; each is a map in
# the admission engine and a label value, so the set has a bound like every other map.
METRICS_MAX = 256


class Metric(StrEnum):
    """Seed 004's metrics, the well-known names. A StrEnum so a member hashes and compares
    like its name; any name `METRIC_NAME` matches is a metric too (`check_metric`)."""

    READ_IOPS = "read_iops"
    CLIENT_EGRESS_BYTES = "client_egress_bytes"
    ORIGIN_READ_BYTES = "origin_read_bytes"
    WRITE_IOPS = "write_iops"
    CLIENT_INGRESS_BYTES = "client_ingress_bytes"
    ORIGIN_WRITE_BYTES = "origin_write_bytes"

    @property
    def unit(self) -> Unit:
        return default_unit(self.value)


def default_unit(metric: str) -> Unit:
    """The unit a policy that names none gets (seed 004's names keep theirs)."""
    return Unit.BYTES if metric.endswith("_bytes") else Unit.REQUESTS


def check_metric(
    value: Any, *, field: str = "metric", error: type[RatemeshError] = ConfigError
) -> str:
    """A metric name as a plain str, or `error` naming `field` (a peer's name is untrusted:
    bounded length and charset before anything else reads it)."""
    if type(value) is str:
        if METRIC_NAME.fullmatch(value):
            return value
    elif isinstance(value, str):  # a Metric member: the plain name
        return check_metric(str(value), field=field, error=error)
    else:
        raise error.type_error(field, f"must be a metric name, got {type(value).__name__}")
    shown = value if len(value) <= 70 else value[:64] + "..."
    raise error(
        field,
        f"{shown!r} is not a metric name: lowercase letters, digits and '_', starting "
        "with a letter, at most 63 characters",
    )


class Mode(StrEnum):
    """How far a limit is coordinated (seed 002), each with the bound it discloses."""

    LOCAL = "local"
    SHARE = "share"
    GLOBAL = "global"
    STRICT = "strict"
    REDIS = "redis"  # one atomic GCRA step per admission against a shared Redis (docs/redis.md)


class Posture(StrEnum):
    """Whether a limit's verdicts are enforced, or only evaluated and counted (`shadow`:
    every call is admitted, and one the limit would deny says so; docs/policies.md)."""

    ENFORCE = "enforce"
    SHADOW = "shadow"


# The modes a shadow posture applies to: their views meter locally and deny in the core.
# strict spends governord credit and redis takes from a shared counter, so a shadow there
# would either take real capacity from enforcing limits or say nothing exact.
SHADOW_MODES = frozenset({Mode.LOCAL, Mode.SHARE, Mode.GLOBAL})


class Period(StrEnum):
    """The UTC calendar period a spend quota runs over (docs/quotas.md)."""

    DAY = "day"
    MONTH = "month"


# A policy for this tenant id applies to every tenant that has no policy of its own; each
# tenant still gets its own RateKey and its own bucket.
DEFAULT_TENANT = "*"

# The descriptor under a tenant is folded into the RateKey's tenant part as
# tenant + DESCRIPTOR_SEP + key + "=" + value. ASCII RS (record separator): no tenant id
# holds a control character, so the encoding is unambiguous both ways.
DESCRIPTOR_SEP = "\x1e"
# A descriptor value "*" is the default for its key under the tenant: each value gets its
# own bucket under that policy, as each tenant does under DEFAULT_TENANT's.
DESCRIPTOR_WILDCARD = "*"
DESCRIPTOR_KEY = re.compile(r"[a-z][a-z0-9_]{0,31}")
DESCRIPTOR_VALUE_MAX = 128

Descriptor = tuple[str, str]  # (key, value): one Envoy-style entry under the tenant


def descriptor_tenant(tenant_id: str, descriptor: Any, *, field: str = "descriptor") -> str:
    """The RateKey tenant part for `tenant_id` narrowed by one descriptor entry.

    `descriptor` is a (key, value) pair, a one-entry mapping `{key: value}`, or the text
    "key=value". The result is what `Mesh.try_admit` takes as its tenant, so the plain call
    costs nothing more.
    """
    check_str("tenant_id", tenant_id)
    if DESCRIPTOR_SEP in tenant_id:
        raise ConfigError("tenant_id", f"{tenant_id!r} already carries a descriptor")
    key, value = _descriptor(descriptor, field)
    return f"{tenant_id}{DESCRIPTOR_SEP}{key}={value}"


def split_tenant(tenant_id: str) -> tuple[str, Descriptor | None]:
    """The inverse of `descriptor_tenant`: (tenant, (key, value)) or (tenant, None)."""
    base, sep, rest = tenant_id.partition(DESCRIPTOR_SEP)
    if not sep:
        return tenant_id, None
    key, _, value = rest.partition("=")
    return base, (key, value)


def scope_name(tenant_id: str, metric: str) -> str:
    """`tenant/metric` for messages, with a descriptor shown as `tenant[key=value]`."""
    tenant, desc = split_tenant(tenant_id)
    return f"{tenant}/{metric}" if desc is None else f"{tenant}[{desc[0]}={desc[1]}]/{metric}"


def _descriptor(value: Any, field: str) -> Descriptor:
    if isinstance(value, dict):
        if len(value) != 1:
            raise ConfigError(
                field,
                f"must hold exactly one key: value under the tenant, got {len(value)} "
                "(deeper nesting is not supported: see docs/policies.md)",
            )
        ((key, val),) = value.items()
    elif isinstance(value, str):
        key, eq, val = value.partition("=")
        if not eq:
            raise ConfigError(field, f"{value!r} must be written key=value")
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        key, val = value
    else:
        raise ConfigError.type_error(
            field, f"must be (key, value), {{key: value}} or 'key=value', got {value!r}"
        )
    if type(key) is not str or not DESCRIPTOR_KEY.fullmatch(key):
        raise ConfigError(
            field, f"key {key!r} must be lowercase letters, digits and '_' (at most 32)"
        )
    if type(val) is not str or not val:
        raise ConfigError(f"{field}.{key}", f"must be a non-empty string, got {val!r}")
    if len(val) > DESCRIPTOR_VALUE_MAX or not val.isprintable():
        raise ConfigError(
            f"{field}.{key}",
            f"must be printable and at most {DESCRIPTOR_VALUE_MAX} characters",
        )
    return key, val


class RateKey(NamedTuple):
    """(tenant_id, metric, policy_generation): one independently metered limit.

    A NamedTuple rather than a dataclass: it is a dict key on the owner's and reporter's
    paths, and tuple hashing is done in C.
    """

    tenant_id: str
    metric: str
    policy_generation: int

    def ring_token(self) -> str:
        """The string the consistent-hash ring places; stable across processes."""
        return f"{self.tenant_id}\x1f{self.metric}\x1f{self.policy_generation}"


@dataclass(frozen=True, slots=True)
class TenantRatePolicy:
    """One immutable generation of a tenant's limit on one metric (seed 004).

    `target_rate` is R in the metric's units per second, `global_burst` is B, and
    `local_burst_cap` is b, the most one worker may spend ahead of its owner's view; each
    may be given as text (`"5000/minute"`, `"1MiB"`: `ratemesh.rates`) and is kept as an
    integer.

    A rate that is not a whole number per second (`"5000/minute"`, 250/3 per second) is
    metered exactly in sub-units: `scale` sub-units make one unit (the rate's denominator,
    `ratemesh.rates.parse_rate`), and `target_rate`, `global_burst` and `local_burst_cap`
    are kept in sub-units (250 per second, bursts times 3), so the owner, the wire,
    governord and the sim meter an ordinary integer policy. Only the admission views convert
    (a unit admitted costs `scale` sub-units; docs/policies.md). A rate given as text fixes
    `scale` and its bursts are read in units; `scale` given (a copy, a stored record) means
    every number is already in sub-units. A whole rate per second has scale 1 and is what it
    was before. `unit` defaults from the metric's name. `tenant_id` is the RateKey's tenant
    part: with a descriptor it is `descriptor_tenant(tenant, descriptor)`; `tenant` and
    `descriptor` read it back, and a `descriptor=` argument is folded into it.
    """

    tenant_id: str
    metric: str
    generation: int
    target_rate: int = None  # type: ignore[assignment]  # None: a quota policy's 0 (no rate)
    global_burst: int = None  # type: ignore[assignment]
    local_burst_cap: int = None  # type: ignore[assignment]
    enabled: bool = True
    mode: Mode = Mode.GLOBAL
    unit: Unit = None  # type: ignore[assignment]  # None: the name's (default_unit)
    descriptor: Descriptor | None = None
    scale: int = None  # type: ignore[assignment]  # None: from target_rate (parse_rate)
    period: Period | None = None  # a spend quota's UTC period (docs/quotas.md)
    quota: int | None = None  # the cap per period, in the metric's unit
    posture: Posture = Posture.ENFORCE  # shadow: evaluated and counted, always admitted
    _key: RateKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_str("tenant_id", self.tenant_id)
        object.__setattr__(self, "metric", check_metric(self.metric))
        check_int("generation", self.generation, minimum=1)
        self._set_quota()
        self._set_numbers()
        check_bool("enabled", self.enabled)
        object.__setattr__(self, "mode", _mode(self.mode))
        unit = default_unit(self.metric) if self.unit is None else _unit(self.unit)
        object.__setattr__(self, "unit", unit)
        if self.mode is Mode.REDIS and unit in _REFUNDED and self.quota is None:
            # Redis's script only ever takes (docs/redis.md): a short send's refund would be
            # dropped, and the limit would run below what it says, silently.
            raise ConfigError(
                "mode",
                f"redis cannot meter {unit} on {self.metric}: they are charged ahead and "
                "refunded when fewer are used, and the redis script cannot give back; use "
                "global or strict for this metric",
            )
        object.__setattr__(self, "posture", _posture(self.posture, self))
        tenant = self.tenant_id
        if DESCRIPTOR_SEP in tenant:  # already folded (a copy, a key's tenant part)
            base, desc = split_tenant(tenant)
            if self.descriptor is not None and _descriptor(self.descriptor, "descriptor") != desc:
                raise ConfigError("descriptor", f"differs from the one in {tenant!r}")
            tenant = descriptor_tenant(base, desc)  # validates both parts
        elif self.descriptor is not None:
            tenant = descriptor_tenant(tenant, self.descriptor)
        object.__setattr__(self, "tenant_id", tenant)
        object.__setattr__(self, "descriptor", split_tenant(tenant)[1])
        # Built once: views and owners key dicts by it, and each copy would cost memory.
        object.__setattr__(self, "_key", RateKey(self.tenant_id, self.metric, self.generation))

    def _set_quota(self) -> None:
        """period and quota: both or neither (docs/quotas.md). A quota policy needs no rate
        fields: those it leaves out are 0, which says "no rate limit, only the quota"."""
        if self.period is None and self.quota is None:
            for name in ("target_rate", "global_burst", "local_burst_cap"):
                if getattr(self, name) is None:
                    raise ConfigError(name, "is required (or give period and quota)")
            return
        if self.period is None:
            raise ConfigError("period", "is required with quota: day or month")
        if self.quota is None:
            raise ConfigError("quota", "is required with period: the cap per period")
        if not isinstance(self.period, Period):
            object.__setattr__(self, "period", check_choice("period", self.period, _PERIODS))
        object.__setattr__(self, "quota", parse_amount("quota", self.quota))
        for name in ("target_rate", "global_burst", "local_burst_cap"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, 0)

    @property
    def is_quota(self) -> bool:
        """Whether this policy carries a spend quota (period and quota)."""
        return self.quota is not None

    def _set_numbers(self) -> None:
        """target_rate, the bursts and scale as integers in sub-units (the class docstring)."""
        low = 0 if self.quota is not None else 1  # a quota policy may carry no rate
        rate = parse_rate("target_rate", self.target_rate, minimum=low)
        burst = parse_amount("global_burst", self.global_burst, minimum=low)
        cap = parse_amount("local_burst_cap", self.local_burst_cap, minimum=low)
        if self.scale is None:
            scale = rate.denominator
            sub_rate = rate.numerator
        else:
            scale = check_int("scale", self.scale, minimum=1)
            if rate.denominator != 1:
                raise ConfigError(
                    "target_rate", "must be whole sub-units per second when scale is given"
                )
            for name, n in (("global_burst", burst), ("local_burst_cap", cap)):
                if n % scale:
                    raise ConfigError(name, f"{n} sub-units must be a multiple of scale {scale}")
            burst //= scale
            cap //= scale
            sub_rate = int(rate)
        for name, n in (("global_burst", burst), ("local_burst_cap", cap)):
            if n * scale > INT_MAX:
                raise ConfigError(name, f"{n} x scale {scale} must be <= {INT_MAX}")
        object.__setattr__(self, "target_rate", sub_rate)
        object.__setattr__(self, "global_burst", burst * scale)
        object.__setattr__(self, "local_burst_cap", cap * scale)
        object.__setattr__(self, "scale", scale)

    @property
    def limit_per_s(self) -> int:
        """The rate in units per second, rounded down: a verdict's `limit` (0 for a rate
        below one a second, such as "1/minute")."""
        return self.target_rate // self.scale

    @property
    def burst_units(self) -> int:
        """`global_burst` in units: the largest amount one admission may ask for."""
        return self.global_burst // self.scale

    @property
    def rate_key(self) -> RateKey:
        return self._key

    @property
    def tenant(self) -> str:
        """The tenant without its descriptor."""
        return split_tenant(self.tenant_id)[0]

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
            self.unit,
            scale=self.scale,
            period=self.period,
            quota=self.quota,
            posture=self.posture,
        )

    @property
    def shadow(self) -> bool:
        """Whether the limit is only evaluated and counted (`Posture.SHADOW`)."""
        return self.posture is Posture.SHADOW

    def values(self) -> tuple[object, ...]:
        """What the policy says, without its generation: two generations with equal values
        are the same limit (a re-apply of unchanged values is no change)."""
        return (
            self.target_rate,
            self.global_burst,
            self.local_burst_cap,
            self.enabled,
            self.mode,
            self.unit,
            self.scale,
            self.period,
            self.quota,
            self.posture,
        )

    def to_dict(self) -> dict[str, Any]:
        """The mapping `from_dict` reads. `unit` and `descriptor` appear only when they say
        something (a unit other than the name's default, a descriptor), so a seed-004
        policy's mapping is what it was in older releases and older peers still read it. A
        rate with scale > 1 is written as text (`rate_text`, "5000/minute") and its bursts
        in units: what the operator wrote, read back to the same policy."""
        tenant, desc = split_tenant(self.tenant_id)
        out: dict[str, Any] = {
            "tenant_id": tenant,
            "metric": self.metric,
            "generation": self.generation,
            "target_rate": self.target_rate,
            "global_burst": self.global_burst,
            "local_burst_cap": self.local_burst_cap,
            "enabled": self.enabled,
        }
        if self.quota is None:  # a spend quota has no mode (its ledger meters it)
            out["mode"] = self.mode.value
        if self.scale != 1:
            out["target_rate"] = rate_text(self.target_rate, self.scale)
            out["global_burst"] = self.burst_units
            out["local_burst_cap"] = self.local_burst_cap // self.scale
        if self.unit is not default_unit(self.metric):
            out["unit"] = self.unit.value
        if desc is not None:
            out["descriptor"] = {desc[0]: desc[1]}
        if self.quota is not None:  # only when set: older peers and logs read the rest
            assert self.period is not None
            out["period"] = self.period.value
            out["quota"] = self.quota
            for name in ("target_rate", "global_burst", "local_burst_cap"):
                if out[name] == 0:
                    del out[name]  # a quota policy with no rate writes none
        if self.posture is not Posture.ENFORCE:  # only when set: older peers read the rest
            out["posture"] = self.posture.value
        return out

    @classmethod
    def from_dict(
        cls,
        data: Any,
        *,
        where: str = "policy",
        error: type[RatemeshError] = ConfigError,
        written: bool = False,
    ) -> TenantRatePolicy:
        """Build from a mapping (YAML, coordinator), naming `where.key` in any error.
        `written`: an operator wrote it (a policy file, a node config), where a key that
        would do nothing is refused rather than read as if it did."""
        if not isinstance(data, dict):
            raise error(where, f"must be a mapping, got {type(data).__name__}")
        # A quota policy (period or quota given) needs no rate fields (docs/quotas.md).
        quota = "period" in data or "quota" in data
        required = _REQUIRED[:3] if quota else _REQUIRED
        unknown = sorted(set(map(str, data)) - set(POLICY_FIELDS))
        if unknown:
            raise error(f"{where}.{unknown[0]}", "unknown key")
        for name in required:
            if name not in data:
                raise error(f"{where}.{name}", "is required")
        if written and quota and "mode" in data:
            # A spend quota is metered by its ledger, never by a mode (docs/quotas.md).
            raise error(f"{where}.mode", "does not apply to a spend quota (period and quota)")
        try:
            return cls(**data)
        except RatemeshError as exc:
            raise rename(exc, where, error) from exc


def check_units(
    policies: Iterable[TenantRatePolicy],
    *,
    where: str = "policies",
    error: type[RatemeshError] = ConfigError,
) -> None:
    """One unit per metric across `policies`, and at most METRICS_MAX metric names; a
    conflict is one ConfigError naming both policies."""
    seen: dict[str, TenantRatePolicy] = {}
    for p in policies:
        first = seen.setdefault(p.metric, p)
        if first.unit is not p.unit:
            raise unit_conflict(first, p, where=where, error=error)
        if len(seen) > METRICS_MAX:
            raise error(where, f"names more than {METRICS_MAX} metrics (METRICS_MAX)")


def unit_conflict(
    first: TenantRatePolicy,
    other: TenantRatePolicy,
    *,
    where: str = "policies",
    error: type[RatemeshError] = ConfigError,
) -> RatemeshError:
    return error(
        f"{where}.unit",
        f"metric {other.metric!r} is counted in {first.unit.value} by "
        f"{_name(first)} and in {other.unit.value} by {_name(other)}; a metric has one unit",
    )


def _name(p: TenantRatePolicy) -> str:
    return f"{scope_name(p.tenant_id, p.metric)} generation {p.generation}"


_UNITS_BY_NAME = {u.value: u for u in Unit} | {"units": Unit.REQUESTS}
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
POLICY_FIELDS = (
    *_REQUIRED,
    "enabled",
    "mode",
    "unit",
    "descriptor",
    "period",
    "quota",
    "posture",
)
_PERIODS = {p.value: p for p in Period}


def _unit(value: Any) -> Unit:
    if isinstance(value, Unit):
        return value
    return check_choice("unit", value, _UNITS_BY_NAME)  # type: ignore[no-any-return]


def _mode(value: Any) -> Mode:
    if isinstance(value, Mode):
        return value
    return check_choice("mode", value, _MODES)  # type: ignore[no-any-return]


_POSTURES = {p.value: p for p in Posture}


def _posture(value: Any, policy: TenantRatePolicy) -> Posture:
    """`posture` as written: a name (`shadow`, `enforce`), or seed 002's `{mode: shadow}`;
    shadow only where `SHADOW_MODES` allows it."""
    if isinstance(value, dict):
        if set(value) != {"mode"}:
            raise ConfigError("posture", "must be enforce, shadow or {mode: enforce|shadow}")
        value = value["mode"]
    posture: Posture = (
        value if isinstance(value, Posture) else check_choice("posture", value, _POSTURES)
    )
    if posture is Posture.SHADOW and (policy.quota is not None or policy.mode not in SHADOW_MODES):
        what = "a spend quota" if policy.quota is not None else f"mode {policy.mode.value}"
        raise ConfigError(
            "posture",
            f"shadow does not apply to {what}: only local, share and global limits can be "
            "evaluated without enforcing (docs/policies.md)",
        )
    return posture

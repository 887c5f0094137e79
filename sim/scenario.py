"""Scenarios are data: a YAML file names the fleet, the policy, the tenants and their load,
the network and the faults. Loading validates every field and names the one that is wrong.

A tenant's load is a rate with a pattern (steady, bursty, diurnal), optionally shaped further:
`phases` (each for `for_s` seconds, at its own `offered` rate, through a subset of `workers`;
`repeat` cycles them), `amounts` (each request's size drawn from weighted values) and
`retry_ms` (a denied request is asked again every `retry_ms` until admitted or `give_up_ms`
after it was first offered). A `core:` mapping sets the mesh core's other knobs
(`mesh.core.config.CoreConfig`, e.g. `views_idle_ms`) for the strategies that run it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mesh.core.config import PARTITION_FLOOR_MS, CoreConfig
from mesh.core.policy import Metric, Unit
from mesh.errors import ConfigError, ConfigTypeError
from ratemesh.checks import check_bool, check_keys, check_number
from ratemesh.policy import check_metric, default_unit
from ratemesh.yamlfile import load_yaml

__all__ = [
    "ConfigError",
    "Scenario",
    "Fleet",
    "Policy",
    "Phase",
    "TenantLoad",
    "TenantGroup",
    "NetworkSpec",
    "Fault",
    "QuotaSpec",
    "ConcurrencySpec",
    "load",
    "load_file",
    "parse",
    "SCENARIO_DIR",
    "names",
    "STRATEGIES",
]

SCENARIO_DIR = Path(__file__).parent / "scenarios"
STRATEGIES = (
    "mesh",
    "local",
    "share",
    "gubernator-global",
    "central-open",
    "central-closed",
    "strict",
)
PATTERNS = ("steady", "bursty", "diurnal")
FAULT_KINDS = (
    "partition",
    "crash",
    "crash_owner",
    "restart",
    "join",
    "leave",
    "policy_change",
    "skew",
    "central_outage",
    "governor_crash",
)


class _Fields:
    """Reads one mapping, tracking its path, so every complaint names the field."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise ConfigTypeError(where, f"must be a mapping, got {type(data).__name__}")
        self.data = data
        self.where = where
        self.used: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        self.used.add(key)
        if key not in self.data:
            if required:
                raise ConfigError(self.path(key), "is required")
            return default
        return self.data[key]

    def num(
        self,
        key: str,
        default: float | None = None,
        *,
        minimum: float = 0.0,
        maximum: float = 1e12,
        required: bool = False,
        integer: bool = False,
    ) -> Any:
        v = self.get(key, default, required=required)
        if v is None:
            return None
        # Finite, no bools, in range: the same check as the mesh's and governord's numbers.
        check_number(self.path(key), v, minimum=minimum, maximum=maximum, error=ConfigError)
        if integer and not isinstance(v, int):
            raise ConfigTypeError(self.path(key), f"must be a whole number, got {v!r}")
        return v

    def flag(self, key: str, default: bool) -> bool:
        return check_bool(self.path(key), self.get(key, default), error=ConfigError)

    def text(
        self,
        key: str,
        default: str | None = None,
        *,
        choices: tuple[str, ...] = (),
        required: bool = False,
    ) -> Any:
        v = self.get(key, default, required=required)
        if v is None:
            return None
        if not isinstance(v, str) or not v:
            raise ConfigTypeError(self.path(key), f"must be a non-empty string, got {v!r}")
        if choices and v not in choices:
            raise ConfigError(
                self.path(key), f"unknown value {v!r}; expected one of: " + ", ".join(choices)
            )
        return v

    def items(self, key: str) -> list[Any]:
        v = self.get(key, [])
        if not isinstance(v, list):
            raise ConfigTypeError(self.path(key), f"must be a list, got {type(v).__name__}")
        return v

    def done(self) -> None:
        """Every key the reader did not ask for is unknown (called after the last `get`)."""
        check_keys(self.where, self.data, self.used, error=ConfigError)


@dataclass(frozen=True)
class Fleet:
    workers: int
    sync_interval_ms: int = 5
    snapshot_ttl_ms: int = 20
    lb_skew: float = 0.0  # worker i gets load in proportion to (i+1) ** -lb_skew
    # CoreConfig.partition_floor_ms (docs/partitions.md): floors on by default; 0 turns off
    partition_floor_ms: int = PARTITION_FLOOR_MS


@dataclass(frozen=True)
class Policy:
    rate: int
    burst: int
    local_burst_cap: int
    metric: str = Metric.READ_IOPS
    unit: Unit | None = None  # None: the metric name's (ratemesh.policy.default_unit)

    @property
    def metric_unit(self) -> Unit:
        return default_unit(self.metric) if self.unit is None else self.unit


@dataclass(frozen=True)
class Phase:
    """A stretch of a tenant's load: `for_s` seconds at `offered` units per second (None: the
    tenant's own rate and pattern; 0: idle), through `workers` only (empty: the load balancer
    over the whole fleet)."""

    for_s: float
    offered: float | None = None
    workers: tuple[str, ...] = ()


@dataclass(frozen=True)
class TenantLoad:
    name: str
    offered: float  # units (requests or bytes) per second, fleet-wide
    pattern: str = "steady"
    quiet: bool = False
    policy: Policy | None = None  # overrides the scenario's default
    start_s: float = 0.0
    burst_on_ms: float = 100.0
    burst_off_ms: float = 400.0
    period_s: float = 4.0
    amplitude: float = 0.8
    request_bytes: int = 0  # byte metrics: each request transfers this much
    chunk_bytes: int = 262_144
    short_send: float = 0.0  # chance a chunk is sent short (the rest refunded)
    phases: tuple[Phase, ...] = ()  # none: the pattern from start_s to the end
    repeat: bool = False  # after the last phase, start again at the first (else: idle)
    amounts: tuple[tuple[int, float], ...] = ()  # (units, weight) per request; none: 1 each
    retry_ms: float | None = None  # a denied request is asked again this often (None: never)
    give_up_ms: float = 2000.0  # ... until this long after it was first offered


@dataclass(frozen=True)
class TenantGroup:
    prefix: str
    count: int
    total_offered: float
    zipf: float = 1.1


@dataclass(frozen=True)
class NetworkSpec:
    latency_ms: float = 0.5
    jitter_ms: float = 0.5
    loss: float = 0.0
    duplicate: float = 0.0


@dataclass(frozen=True)
class Fault:
    kind: str
    at_s: float
    until_s: float | None = None  # partitions and outages heal then
    members: tuple[str, ...] = ()
    tenant: str | None = None
    offset_ms: float = 0.0
    policy: Policy | None = None


@dataclass(frozen=True)
class QuotaSpec:
    """A spend-quota scenario (sim/quota.py, docs/quotas.md): each tenant's cap for the
    run's period and the workers' publish cadence."""

    cap: int
    publish_ms: int = 1000


@dataclass(frozen=True)
class ConcurrencySpec:
    """An in-flight cap scenario (sim/concurrency.py, docs/policies.md): C per tenant, how
    long each admitted request holds its slot, b, and the global mode's lease and member
    TTLs."""

    cap: int
    hold_ms: int = 50
    local_burst_cap: int = 0  # 0: C
    lease_ttl_ms: int = 100
    member_ttl_ms: int = 1000


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float
    fleet: Fleet
    policy: Policy
    tenants: tuple[TenantLoad, ...] = ()
    groups: tuple[TenantGroup, ...] = ()
    network: NetworkSpec = field(default_factory=NetworkSpec)
    faults: tuple[Fault, ...] = ()
    strategies: tuple[str, ...] = STRATEGIES
    warmup_s: float = 0.5
    step_ms: float = 1.0
    quota: QuotaSpec | None = None  # a spend-quota scenario (sim/quota.py) when set
    concurrency: ConcurrencySpec | None = None  # an in-flight cap (sim/concurrency.py)
    core: tuple[tuple[str, int], ...] = ()  # CoreConfig fields beyond the fleet's, sorted

    def worker_ids(self) -> list[str]:
        return [f"w{i:04d}" for i in range(self.fleet.workers)]

    def core_config(self) -> CoreConfig:
        """The mesh core's config for this scenario: the fleet's timings and `core:`."""
        fl = self.fleet
        return CoreConfig(
            sync_interval_ms=fl.sync_interval_ms,
            snapshot_ttl_ms=fl.snapshot_ttl_ms,
            partition_floor_ms=fl.partition_floor_ms,
            **dict(self.core),
        )


def _unit(value: str | None) -> Unit | None:
    return None if value is None else Unit(value)


def _quota(data: Any, where: str) -> QuotaSpec | None:
    if data is None:
        return None
    f = _Fields(data, where)
    q = QuotaSpec(
        cap=f.num("cap", required=True, minimum=1, integer=True),
        publish_ms=f.num("publish_ms", 1000, minimum=1, maximum=600_000, integer=True),
    )
    f.done()
    return q


def _concurrency(data: Any, where: str) -> ConcurrencySpec | None:
    if data is None:
        return None
    f = _Fields(data, where)
    cap = f.num("cap", required=True, minimum=1, integer=True)
    c = ConcurrencySpec(
        cap=cap,
        hold_ms=f.num("hold_ms", 50, minimum=1, maximum=600_000, integer=True),
        local_burst_cap=f.num("local_burst_cap", 0, minimum=0, maximum=cap, integer=True),
        lease_ttl_ms=f.num("lease_ttl_ms", 100, minimum=8, maximum=600_000, integer=True),
        member_ttl_ms=f.num("member_ttl_ms", 1000, minimum=8, maximum=3_600_000, integer=True),
    )
    f.done()
    if c.member_ttl_ms < c.lease_ttl_ms:
        raise ConfigError(f"{where}.member_ttl_ms", "must be >= lease_ttl_ms")
    return c


# Set under `fleet:` (every strategy reads them there), so not again under `core:`.
FLEET_KNOBS = ("sync_interval_ms", "snapshot_ttl_ms", "partition_floor_ms")


def _core(data: Any, where: str) -> tuple[tuple[str, int], ...]:
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise ConfigTypeError(where, f"must be a mapping, got {type(data).__name__}")
    for key in sorted(data):
        if key in FLEET_KNOBS:
            raise ConfigError(f"{where}.{key}", f"is set under fleet: (fleet.{key})")
    CoreConfig.from_dict(data, where=where)  # every field checked, and named, by the core
    return tuple(sorted(data.items()))


def _policy(data: Any, where: str) -> Policy:
    f = _Fields(data, where)
    p = Policy(
        rate=f.num("rate", required=True, minimum=1, integer=True),
        burst=f.num("burst", required=True, minimum=1, integer=True),
        local_burst_cap=f.num("local_burst_cap", required=True, minimum=1, integer=True),
        metric=check_metric(
            f.text("metric", "read_iops"), field=f.path("metric"), error=ConfigError
        ),
        unit=_unit(f.text("unit", None, choices=tuple(u.value for u in Unit))),
    )
    f.done()
    return p


def _tenant(data: Any, where: str, workers: set[str]) -> TenantLoad:
    f = _Fields(data, where)
    t = TenantLoad(
        name=f.text("name", required=True),
        offered=f.num("offered", required=True),
        pattern=f.text("pattern", "steady", choices=PATTERNS),
        quiet=f.flag("quiet", False),
        policy=_policy(f.get("policy"), f.path("policy")) if f.get("policy") else None,
        start_s=f.num("start_s", 0.0),
        burst_on_ms=f.num("burst_on_ms", 100.0, minimum=1),
        burst_off_ms=f.num("burst_off_ms", 400.0, minimum=0),
        period_s=f.num("period_s", 4.0, minimum=0.01),
        amplitude=f.num("amplitude", 0.8, maximum=1.0),
        request_bytes=f.num("request_bytes", 0, integer=True),
        chunk_bytes=f.num("chunk_bytes", 262_144, minimum=1, integer=True),
        short_send=f.num("short_send", 0.0, maximum=1.0),
        phases=tuple(
            _phase(p, f"{f.path('phases')}[{i}]", workers) for i, p in enumerate(f.items("phases"))
        ),
        repeat=f.flag("repeat", False),
        amounts=_amounts(f.get("amounts"), f.path("amounts")),
        retry_ms=f.num("retry_ms", None, minimum=0.1, maximum=600_000),
        give_up_ms=f.num("give_up_ms", 2000.0, minimum=0.1, maximum=3_600_000),
    )
    f.done()
    if t.repeat and not t.phases:
        raise ConfigError(f.path("repeat"), "needs phases to repeat")
    if t.repeat and sum(p.for_s for p in t.phases) <= 0:
        raise ConfigError(f.path("phases"), "must last some time to repeat")
    if t.amounts and t.request_bytes:
        raise ConfigError(f.path("amounts"), "is for request metrics; bytes use request_bytes")
    return t


def _worker_list(data: Any, where: str, workers: set[str]) -> tuple[str, ...]:
    if isinstance(data, str):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(m, str) for m in data):
        raise ConfigTypeError(where, "must be a list of worker ids")
    for i, m in enumerate(data):
        if m not in workers:
            raise ConfigError(
                f"{where}[{i}]", f"no worker {m!r} in this fleet (ids are w0000, w0001, ...)"
            )
    return tuple(data)


def _phase(data: Any, where: str, workers: set[str]) -> Phase:
    f = _Fields(data, where)
    p = Phase(
        for_s=f.num("for_s", required=True, maximum=3600),
        offered=f.num("offered"),
        workers=_worker_list(f.get("workers", []), f.path("workers"), workers),
    )
    f.done()
    return p


def _amounts(data: Any, where: str) -> tuple[tuple[int, float], ...]:
    """`[{amount: 5, weight: 2}, ...]` (weight 1 by default), or a plain list of amounts."""
    if data is None:
        return ()
    if not isinstance(data, list) or not data:
        raise ConfigTypeError(where, "must be a non-empty list")
    out = []
    for i, item in enumerate(data):
        f = _Fields(item if isinstance(item, dict) else {"amount": item}, f"{where}[{i}]")
        out.append(
            (
                f.num("amount", required=True, minimum=1, integer=True),
                f.num("weight", 1.0, minimum=1e-9),
            )
        )
        f.done()
    return tuple(out)


def _group(data: Any, where: str) -> TenantGroup:
    f = _Fields(data, where)
    g = TenantGroup(
        prefix=f.text("prefix", required=True),
        count=f.num("count", required=True, minimum=1, maximum=1e6, integer=True),
        total_offered=f.num("total_offered", required=True),
        zipf=f.num("zipf", 1.1, maximum=10),
    )
    f.done()
    return g


def _fault(data: Any, where: str, workers: set[str], tenants: set[str]) -> Fault:
    f = _Fields(data, where)
    kind = f.text("kind", required=True, choices=FAULT_KINDS)
    members = f.get("members", [])
    if isinstance(members, str):
        members = [members]
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise ConfigTypeError(f.path("members"), "must be a list of worker ids")
    for i, m in enumerate(members):
        if m not in workers and kind not in ("join",):
            raise ConfigError(
                f"{f.path('members')}[{i}]",
                f"no worker {m!r} in this fleet (ids are w0000, w0001, ...)",
            )
    tenant = f.text("tenant")
    if tenant is not None and tenant not in tenants:
        raise ConfigError(f.path("tenant"), f"no tenant {tenant!r} in this scenario")
    fault = Fault(
        kind=kind,
        at_s=f.num("at_s", required=True),
        until_s=f.num("until_s"),
        members=tuple(members),
        tenant=tenant,
        offset_ms=f.num("offset_ms", 0.0, minimum=-1e6),
        policy=_policy(f.get("policy"), f.path("policy")) if f.get("policy") else None,
    )
    f.done()
    if fault.until_s is not None and fault.until_s <= fault.at_s:
        raise ConfigError(f.path("until_s"), "must be after at_s")
    needs = {
        "partition": "members",
        "crash": "members",
        "restart": "members",
        "join": "members",
        "leave": "members",
        "skew": "members",
        "crash_owner": "tenant",
        "policy_change": "tenant",
    }
    if kind in needs and not getattr(fault, needs[kind]):
        raise ConfigError(f.path(needs[kind]), f"is required for a {kind} fault")
    if kind == "policy_change" and fault.policy is None:
        raise ConfigError(f.path("policy"), "is required for a policy_change fault")
    return fault


def parse(data: Any, *, where: str = "") -> Scenario:
    """Validate a scenario mapping (as loaded from YAML) and build it."""
    f = _Fields(data, where)
    ff = _Fields(f.get("fleet", None, required=True), f.path("fleet"))
    fleet = Fleet(
        workers=ff.num("workers", required=True, minimum=1, maximum=100_000, integer=True),
        sync_interval_ms=ff.num("sync_interval_ms", 5, minimum=1, maximum=1000, integer=True),
        snapshot_ttl_ms=ff.num("snapshot_ttl_ms", 20, minimum=1, maximum=60_000, integer=True),
        lb_skew=ff.num("lb_skew", 0.0, maximum=10),
        partition_floor_ms=ff.num(
            "partition_floor_ms", PARTITION_FLOOR_MS, minimum=0, maximum=600_000, integer=True
        ),
    )
    ff.done()
    if fleet.snapshot_ttl_ms < fleet.sync_interval_ms:
        raise ConfigError(ff.path("snapshot_ttl_ms"), "must be at least sync_interval_ms")
    nf = _Fields(f.get("network", {}), f.path("network"))
    network = NetworkSpec(
        latency_ms=nf.num("latency_ms", 0.5, maximum=10_000),
        jitter_ms=nf.num("jitter_ms", 0.5, maximum=10_000),
        loss=nf.num("loss", 0.0, maximum=1.0),
        duplicate=nf.num("duplicate", 0.0, maximum=1.0),
    )
    nf.done()
    fleet_ids = {f"w{i:04d}" for i in range(fleet.workers)}
    tenants = tuple(
        _tenant(t, f"{f.path('tenants')}[{i}]", fleet_ids) for i, t in enumerate(f.items("tenants"))
    )
    groups = tuple(_group(g, f"{f.path('groups')}[{i}]") for i, g in enumerate(f.items("groups")))
    if not tenants and not groups:
        raise ConfigError(f.path("tenants"), "a scenario needs tenants or groups")
    names_seen = [t.name for t in tenants]
    if len(set(names_seen)) != len(names_seen):
        raise ConfigError(f.path("tenants"), "tenant names must be unique")
    workers = {f"w{i:04d}" for i in range(fleet.workers + 64)}  # joiners may be new ids
    faults = tuple(
        _fault(x, f"{f.path('faults')}[{i}]", workers, set(names_seen))
        for i, x in enumerate(f.items("faults"))
    )
    strategies = f.get("strategies", list(STRATEGIES))
    if not isinstance(strategies, list) or not strategies:
        raise ConfigTypeError(f.path("strategies"), "must be a non-empty list")
    for i, s in enumerate(strategies):
        if s not in STRATEGIES:
            raise ConfigError(
                f"{f.path('strategies')}[{i}]",
                f"unknown strategy {s!r}; expected one of: " + ", ".join(STRATEGIES),
            )
    sc = Scenario(
        name=f.text("name", required=True),
        description=f.text("description", "-"),
        duration_s=f.num("duration_s", required=True, minimum=0.01, maximum=3600),
        fleet=fleet,
        policy=_policy(f.get("policy", None, required=True), f.path("policy")),
        tenants=tenants,
        groups=groups,
        network=network,
        faults=faults,
        strategies=tuple(strategies),
        warmup_s=f.num("warmup_s", 0.5, maximum=60),
        step_ms=f.num("step_ms", 1.0, minimum=0.1, maximum=100),
        quota=_quota(f.get("quota"), f.path("quota")),
        concurrency=_concurrency(f.get("concurrency"), f.path("concurrency")),
        core=_core(f.get("core"), f.path("core")),
    )
    f.done()
    for i, t in enumerate(tenants):
        if (t.policy or sc.policy).metric_unit is Unit.BYTES and t.request_bytes <= 0:
            raise ConfigError(
                f"{f.path('tenants')}[{i}].request_bytes", "is required (> 0) for a byte metric"
            )
    return sc


def load_file(path: str | Path) -> Scenario:
    """Read and validate a scenario file; every mistake is a ConfigError naming the file or
    the field."""
    return parse(load_yaml(path, field="scenario_file", error=ConfigError))


def names() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load(name: str) -> Scenario:
    path = SCENARIO_DIR / f"{name}.yaml"
    if not path.exists():
        raise ConfigError("scenario", f"unknown scenario {name!r}; known: " + ", ".join(names()))
    return load_file(path)

"""The mesh's policies as governord holds them: per (tenant_id, metric), its generations.

governord is the mesh's policy coordinator. Each put or removal is an event in the
one log (``PolicyPut``, ``PolicyRemoved``), applied here live and on replay, so generations
are allocated from durable state: they only grow per key, across restarts, and a number is
never given to two different policies. A removal is a tombstone generation: the key's number
keeps counting from it.

Bounds: ``POLICY_KEYS_MAX`` keys (a removed key still counts: its last generation must be
remembered), and ``POLICY_HISTORY_MAX`` generations of history per key (older ones are dropped
from the history; the key's last generation is never forgotten).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ratemesh.errors import RatemeshError
from ratemesh.policy import Mode, Posture, TenantRatePolicy, Unit, check_metric, default_unit

from . import _events as ev

__all__ = [
    "POLICY_HISTORY_MAX",
    "POLICY_KEYS_MAX",
    "PolicyBook",
    "PolicyKey",
    "PolicyRecord",
]

POLICY_KEYS_MAX = 4096
POLICY_HISTORY_MAX = 16

Scope = tuple[str, str]


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """One generation of a key: its policy, or None for a removal (tombstone)."""

    generation: int
    at_ms: int
    policy: TenantRatePolicy | None


@dataclass(slots=True)
class PolicyKey:
    """One (tenant_id, metric): its last generation (a policy's or a tombstone's) and its
    recent history, oldest first."""

    last: PolicyRecord
    history: deque[PolicyRecord] = field(default_factory=lambda: deque(maxlen=POLICY_HISTORY_MAX))

    @property
    def current(self) -> TenantRatePolicy | None:
        return self.last.policy

    def find(self, generation: int) -> PolicyRecord | None:
        return next((r for r in self.history if r.generation == generation), None)


def policy_of(e: ev.PolicyPut) -> TenantRatePolicy:
    return TenantRatePolicy(
        e.tenant_id,
        e.metric,
        e.generation,
        e.target_rate,
        e.global_burst,
        e.local_burst_cap,
        e.enabled,
        e.mode,
        e.unit or default_unit(e.metric),
        scale=1 if e.scale is None else e.scale,
        period=e.period,  # type: ignore[arg-type]  # the policy reads the text
        quota=e.quota,
        posture=e.posture or Posture.ENFORCE,  # a record before postures: enforcing
    )


class PolicyBook:
    """Every key's generations, and ``revision``: the count of policy events applied, which
    the coordinator API hands out so a watcher asks for what is newer than it has."""

    def __init__(self) -> None:
        self.revision = 0
        self.keys: dict[Scope, PolicyKey] = {}

    def last_generation(self, tenant_id: str, metric: str) -> int:
        key = self.keys.get((tenant_id, metric))
        return 0 if key is None else key.last.generation

    def current(self) -> list[TenantRatePolicy]:
        """Every key's current policy (removed keys left out), in key order."""
        out = []
        for scope in sorted(self.keys):
            policy = self.keys[scope].current
            if policy is not None:
                out.append(policy)
        return out

    def tombstones(self) -> list[tuple[str, str, int]]:
        """Every key whose last generation is a removal, in key order."""
        return [
            (t, m, k.last.generation)
            for (t, m), k in sorted(self.keys.items())
            if k.current is None
        ]

    # ---- the one code path (State.apply calls these) -------------------------------------

    def put(self, e: ev.PolicyPut) -> None:
        try:
            policy = policy_of(e)
        except RatemeshError as exc:  # a record the engine never wrote: refuse to load it
            raise AssertionError(f"the stored policy is not valid: {exc}") from exc
        self._record((e.tenant_id, e.metric), PolicyRecord(e.generation, e.at_ms, policy))

    def removed(self, e: ev.PolicyRemoved) -> None:
        self._record((e.tenant_id, e.metric), PolicyRecord(e.generation, e.at_ms, None))

    def _record(self, scope: Scope, record: PolicyRecord) -> None:
        key = self.keys.get(scope)
        if key is None:
            assert len(self.keys) < POLICY_KEYS_MAX, "the engine checks the bound first"
            key = self.keys[scope] = PolicyKey(record)
        else:
            assert record.generation > key.last.generation, "generations only grow per key"
            key.last = record
        key.history.append(record)
        self.revision += 1

    # ---- snapshot -------------------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "keys": [
                [t, m, [_dump_record(r) for r in k.history]]
                for (t, m), k in sorted(self.keys.items())
            ],
        }

    @classmethod
    def load(cls, data: Any) -> PolicyBook:
        """From ``dump``; None (a snapshot from before policies were kept) is an empty book."""
        book = cls()
        if data is None:
            return book
        book.revision = int(data["revision"])
        for tenant_id, metric, records in data["keys"]:
            scope = (str(tenant_id), check_metric(metric))
            loaded = [_load_record(scope, r) for r in records]
            if not loaded:
                raise ValueError(f"policy key {scope} has no generation")
            key = PolicyKey(loaded[-1])
            key.history.extend(loaded)
            book.keys[scope] = key
        return book


def _dump_record(r: PolicyRecord) -> list[Any]:
    p = r.policy
    extra = {} if p is None else _extra_of(p)
    values = (
        None
        if p is None
        else [
            p.target_rate,
            p.global_burst,
            p.local_burst_cap,
            p.enabled,
            p.mode.value,
            # The unit only when it is not the name's or more follows: older snapshots
            # have five; the scale only when it is not 1 (sub-units, as stored) or more follows.
            *(
                []
                if p.unit is default_unit(p.metric) and p.scale == 1 and not extra
                else [p.unit.value]
            ),
            *([] if p.scale == 1 and not extra else [p.scale]),
            # A spend quota's period and cap, and a shadow posture: last, as a mapping.
            *([extra] if extra else []),
        ]
    )
    return [r.generation, r.at_ms, values]


def _extra_of(p: TenantRatePolicy) -> dict[str, Any]:
    """The record's trailing mapping: a quota's period and cap, and a posture other than
    enforcing (a snapshot before postures has none: enforcing)."""
    out: dict[str, Any] = {}
    if p.quota is not None and p.period is not None:
        out.update(period=p.period.value, quota=p.quota)
    if p.posture is not Posture.ENFORCE:
        out["posture"] = p.posture.value
    return out


def _load_record(scope: Scope, raw: list[Any]) -> PolicyRecord:
    generation, at_ms, values = raw
    if values is None:
        return PolicyRecord(int(generation), int(at_ms), None)
    rate, burst, cap, enabled, mode, *unit = values
    quota = unit.pop() if unit and isinstance(unit[-1], dict) else {}
    scale = unit[1] if len(unit) > 1 else 1
    policy = TenantRatePolicy(
        scope[0],
        scope[1],
        generation,
        rate,
        burst,
        cap,
        enabled,
        Mode(mode),
        Unit(unit[0]) if unit else default_unit(scope[1]),
        scale=scale,
        period=quota.get("period"),
        quota=quota.get("quota"),
        posture=Posture(quota.get("posture", Posture.ENFORCE)),
    )
    return PolicyRecord(int(generation), int(at_ms), policy)

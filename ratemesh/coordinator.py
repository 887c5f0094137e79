"""The coordinator API's wire shapes, shared by the nodes (`mesh.peer`) and governord.

One gRPC service, `ratemesh.coordinator.v1.Coordinator`, msgpack bodies, four methods:

    Put      {policy, expect_generation?} -> {policy, revision, created}
             a policy as the next generation of its (tenant_id, metric); `policy.generation`
             may be left out (the coordinator allocates it) or name the generation it must get
    Remove   {tenant_id, metric, expect_generation?} -> {removed, revision}
             a tombstone generation: the key has no policy of its own from then on
    List     {} -> PolicySnapshot
    Watch    {after_revision, declared?, member_id?} -> stream of PolicySnapshot, one whenever
             the revision passes; `declared`: the policies the node loads from its own file
    History  {tenant_id, metric?} -> {history: [HistoryEntry...]}, oldest first

A caller names itself with an API key in the `x-ratemesh-api-key` metadata. Decoding here
checks shape and size; a bad message raises `error` (the caller's `MessageError` family)
naming the field and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from ratemesh.checks import check_int, check_str
from ratemesh.errors import MessageError, RatemeshError
from ratemesh.policy import TenantRatePolicy, check_metric

__all__ = [
    "API_KEY_MD",
    "COORDINATOR_SERVICE",
    "KEEPALIVE_MS",
    "PING_INTERVAL_MIN_MS",
    "METHODS",
    "SNAPSHOT_POLICIES_MAX",
    "HistoryEntry",
    "PolicySnapshot",
    "Tombstone",
    "decode_metric",
    "method_path",
    "pack",
    "unpack",
]

COORDINATOR_SERVICE = "ratemesh.coordinator.v1.Coordinator"
METHODS = ("Put", "Remove", "List", "Watch", "History")
API_KEY_MD = "x-ratemesh-api-key"
# Keepalive that both ends accept: a client (a node's watch) pings an idle connection every
# KEEPALIVE_MS; a server accepts a ping every PING_INTERVAL_MIN_MS without data, half that,
# so jitter never makes a ping look too early (gRPC's default answered GOAWAY `too_many_pings`
# at the third ping and ended every idle watch).
KEEPALIVE_MS = 10_000
PING_INTERVAL_MIN_MS = KEEPALIVE_MS // 2
# Policies and tombstones one snapshot may carry: at ~130 bytes each this fits a 1 MiB message.
SNAPSHOT_POLICIES_MAX = 6144

Family = type[RatemeshError]


def method_path(name: str) -> str:
    return f"/{COORDINATOR_SERVICE}/{name}"


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes, what: str, error: Family = MessageError) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (msgpack.UnpackException, ValueError) as exc:
        raise error(what, f"not valid msgpack: {exc}") from exc


def decode_metric(field: str, value: Any, error: Family = MessageError) -> str:
    """A metric name from a peer: checked against the one rule, bounded before it is read."""
    return check_metric(value, field=field, error=error)


def _mapping(field: str, obj: Any, error: Family) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise error.type_error(field, f"must be a mapping, got {type(obj).__name__}")
    return obj


def _list(field: str, obj: Any, error: Family) -> list[Any]:
    if not isinstance(obj, list):
        raise error.type_error(field, f"must be a list, got {type(obj).__name__}")
    if len(obj) > SNAPSHOT_POLICIES_MAX:
        raise error(field, f"holds {len(obj)} entries; at most {SNAPSHOT_POLICIES_MAX}")
    return obj


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A removal: generation `generation` of (tenant_id, metric) is "no policy of its own"."""

    tenant_id: str
    metric: str
    generation: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "metric": self.metric,
            "generation": self.generation,
        }

    @classmethod
    def from_wire(cls, obj: Any, where: str, error: Family = MessageError) -> Tombstone:
        d = _mapping(where, obj, error)
        return cls(
            check_str(f"{where}.tenant_id", d.get("tenant_id"), error=error),
            decode_metric(f"{where}.metric", d.get("metric"), error),
            check_int(f"{where}.generation", d.get("generation"), minimum=1, error=error),
        )


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """Every current policy the coordinator holds (and recent removals), as of `revision`,
    which grows with each put or removal and never goes back (governord keeps it durably)."""

    revision: int
    policies: tuple[TenantRatePolicy, ...]
    removed: tuple[Tombstone, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "policies": [p.to_dict() for p in self.policies],
            "removed": [t.to_wire() for t in self.removed],
        }

    @classmethod
    def from_wire(cls, obj: Any, error: Family = MessageError) -> PolicySnapshot:
        if not isinstance(obj, dict) or not isinstance(obj.get("policies"), list):
            raise error("policies", "must be {revision, policies: [...]}")
        rev = obj.get("revision")
        if type(rev) is not int or rev < 0:
            raise error("revision", "must be an integer >= 0")
        policies = _list("policies", obj["policies"], error)
        removed = _list("removed", obj.get("removed", []), error)
        return cls(
            rev,
            tuple(
                TenantRatePolicy.from_dict(p, where=f"policies[{i}]", error=error)
                for i, p in enumerate(policies)
            ),
            tuple(Tombstone.from_wire(t, f"removed[{i}]", error) for i, t in enumerate(removed)),
        )


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One generation of a key: a policy, or (policy None) its removal; `at_ms` is when
    the coordinator recorded it (its wall clock, milliseconds since the epoch)."""

    tenant_id: str
    metric: str
    generation: int
    at_ms: int
    policy: TenantRatePolicy | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "metric": self.metric,
            "generation": self.generation,
            "at_ms": self.at_ms,
            "policy": None if self.policy is None else self.policy.to_dict(),
        }

    @classmethod
    def from_wire(cls, obj: Any, where: str, error: Family = MessageError) -> HistoryEntry:
        d = _mapping(where, obj, error)
        raw = d.get("policy")
        policy = (
            None
            if raw is None
            else TenantRatePolicy.from_dict(raw, where=f"{where}.policy", error=error)
        )
        return cls(
            check_str(f"{where}.tenant_id", d.get("tenant_id"), error=error),
            decode_metric(f"{where}.metric", d.get("metric"), error),
            check_int(f"{where}.generation", d.get("generation"), minimum=1, error=error),
            check_int(f"{where}.at_ms", d.get("at_ms"), error=error),
            policy,
        )

    @staticmethod
    def list_from_wire(obj: Any, error: Family = MessageError) -> list[HistoryEntry]:
        d = _mapping("history", obj, error)
        items = _list("history", d.get("history"), error)
        return [HistoryEntry.from_wire(e, f"history[{i}]", error) for i, e in enumerate(items)]

"""Slot messages (in-flight caps, docs/policies.md): what a worker and a key's owner say to
each other about in-flight slots in global mode, and their form on the peer wire.

A worker reports, per scope it holds or wants slots in, its in-flight count, the allowance
it holds and what it wants; the owner answers each report with a grant echoing the report's
sequence number, so a worker adopts only answers to reports it sent, in order, and times the
allowance from when it sent the report (the owner's clock is never read).

On the wire: `[schema, "slots", sender, ring_epoch, rows]` with rows [tenant_id, metric,
worker_epoch, seq, in_flight, allowance, want], and `[schema, "slot_grants", sender,
ring_epoch, rows]` with rows [tenant_id, metric, worker_epoch, seq, allowance,
lease_ttl_ms]. Every field is checked before anything is built; a bad one is a MessageError
naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mesh.errors import MessageError, MessageTypeError
from ratemesh.checks import INT_MAX, check_int, check_str
from ratemesh.policy import RateKey, check_metric

__all__ = [
    "SLOT_KINDS",
    "SLOT_ROWS_MAX",
    "Scope",
    "SlotGrant",
    "SlotGrants",
    "SlotReport",
    "SlotReports",
    "ring_key",
    "slots_from_wire",
    "slots_to_wire",
]

# (tenant_id, metric): an in-flight cap counts across policy generations, since slots taken
# under the old one are still held when a new one arrives.
Scope = tuple[str, str]


def ring_key(scope: Scope) -> RateKey:
    """Where a scope's owner sits on the ring: one place for every generation."""
    return RateKey(scope[0], scope[1], 0)


@dataclass(frozen=True, slots=True)
class SlotReport:
    """A worker's holdings in one scope as of when it sent this (sequence `seq` within its
    `worker_epoch`, a new process being a new epoch)."""

    scope: Scope
    worker_epoch: int
    seq: int
    in_flight: int
    allowance: int
    want: int


@dataclass(frozen=True, slots=True)
class SlotGrant:
    """The owner's answer to report `seq`: hold at most `allowance` in flight, for
    `lease_ttl_ms` counted from when that report was sent."""

    scope: Scope
    worker_epoch: int
    seq: int
    allowance: int
    lease_ttl_ms: int


# Rows one slot message carries: a worker reports at most this many scopes to one owner per
# sync interval (the rest go next interval), and an owner answers as many.
SLOT_ROWS_MAX = 256


@dataclass(frozen=True, slots=True)
class SlotReports:
    """A worker's reports to one owner, one sync interval (the peer wire's "slots")."""

    sender: str
    ring_epoch: int
    rows: tuple[SlotReport, ...]


@dataclass(frozen=True, slots=True)
class SlotGrants:
    """An owner's answers to one worker's reports (the peer wire's "slot_grants")."""

    sender: str
    ring_epoch: int
    rows: tuple[SlotGrant, ...]


SLOT_KINDS = ("slots", "slot_grants")
_WIDTH = {"slots": 7, "slot_grants": 6}


def slots_to_wire(schema: int, msg: SlotReports | SlotGrants) -> list[Any]:
    if isinstance(msg, SlotReports):
        rows: list[list[Any]] = [
            [*r.scope, r.worker_epoch, r.seq, r.in_flight, r.allowance, r.want] for r in msg.rows
        ]
        return [schema, "slots", msg.sender, msg.ring_epoch, rows]
    rows = [[*g.scope, g.worker_epoch, g.seq, g.allowance, g.lease_ttl_ms] for g in msg.rows]
    return [schema, "slot_grants", msg.sender, msg.ring_epoch, rows]


def slots_from_wire(obj: Any) -> SlotReports | SlotGrants:
    _, kind, sender, ring_epoch, items = obj[:5]
    check_str("sender", sender, error=MessageError)
    check_int("ring_epoch", ring_epoch, minimum=0, error=MessageError)
    if not isinstance(items, (list, tuple)):
        raise MessageTypeError("rows", "must be an array")
    if len(items) > SLOT_ROWS_MAX:
        raise MessageError("rows", f"at most {SLOT_ROWS_MAX} items, got {len(items)}")
    width = _WIDTH[kind]
    out: list[Any] = []
    for i, it in enumerate(items):
        if not isinstance(it, (list, tuple)) or len(it) != width:
            raise MessageTypeError(f"rows[{i}]", f"must be an array of {width} fields")
        tenant, metric, *nums = it
        check_str(f"rows[{i}].tenant_id", tenant, error=MessageError)
        check_metric(metric, field=f"rows[{i}].metric", error=MessageError)
        for j, n in enumerate(nums):
            check_int(f"rows[{i}][{j + 2}]", n, minimum=0, maximum=INT_MAX, error=MessageError)
        scope = (tenant, metric)
        out.append(SlotReport(scope, *nums) if kind == "slots" else SlotGrant(scope, *nums))
    if kind == "slots":
        return SlotReports(sender, ring_epoch, tuple(out))
    return SlotGrants(sender, ring_epoch, tuple(out))

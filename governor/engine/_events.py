"""The events: every durable change of the engine's state, as past-tense facts.

Each carries the sequence number it was given under the engine's lock and the time it happened.
Applying an event is the only way state changes, live or on replay. Heartbeats, waiting acquires
and purges of old tombstones are deliberately not events (see the module docs of ``_engine``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ratemesh.policy import Mode, Posture, Unit, check_metric

from ._codec import decode_value, encode_value
from ._errors import UnknownEventKind
from ._types import AdaptiveConfig, Defaults, LeaseEnd, NodeState, Rate, RequestTag

__all__ = [
    "AdaptiveSet",
    "Charged",
    "CooldownSet",
    "DeadlineSet",
    "DefaultsSet",
    "Event",
    "EVENT_KINDS",
    "LeaseEnded",
    "LeaseGranted",
    "LimitAdjusted",
    "LimitSet",
    "NodeCreated",
    "NodeEnded",
    "PolicyPut",
    "PolicyRemoved",
    "QuotaSet",
    "SessionClosed",
    "SessionExpired",
    "SessionOpened",
    "WeightSet",
    "RateSet",
    "CreditGranted",
    "CreditReturned",
    "decode_event",
    "encode_event",
]


@dataclass(frozen=True, slots=True)
class SessionOpened:
    """``key_sha256``: set on a bare API key's session (the digest of the key it serves), so
    the key finds its session again after a restart; its token is random and never handed
    out. A later field: records written before it decode with None."""

    seq: int
    at_ms: int
    session_id: int
    scope_id: int
    ttl_ms: int
    token_sha256: str
    key_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class SessionClosed:
    seq: int
    at_ms: int
    session_id: int


@dataclass(frozen=True, slots=True)
class SessionExpired:
    seq: int
    at_ms: int
    session_id: int


@dataclass(frozen=True, slots=True)
class NodeCreated:
    seq: int
    at_ms: int
    node_id: int
    parent_id: int
    name: str
    quotas: dict[str, int]
    limits: dict[str, int]
    weight: int
    priority: int
    deadline_ms: int | None
    defaults: Defaults | None
    session_id: int | None
    request: RequestTag | None
    rates: dict[str, Rate] = field(default_factory=dict)  # absent in logs from before rates


@dataclass(frozen=True, slots=True)
class Charged:
    """A consume applied to the node and every ancestor, all at once."""

    seq: int
    at_ms: int
    node_id: int
    resource: str
    amount: int
    session_id: int | None
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class RateSet:
    """A quota node's rate for one resource set (or with ``None`` removed); see ``_bucket``."""

    seq: int
    at_ms: int
    node_id: int
    resource: str
    rate: Rate | None
    session_id: int | None
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class CreditGranted:
    """A credit block charged to its node and every ancestor (caps and rated buckets), logged
    before the worker hears of it."""

    seq: int
    at_ms: int
    block_id: int
    session_id: int
    node_id: int
    resource: str
    units: int
    expires_ms: int
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class CreditReturned:
    """The unused units of a live block came back: applied once per block id. ``request``
    (a later field: records written before it decode with None) lets a resend of the return,
    one that straddled a restart or a takeover, get the first answer."""

    seq: int
    at_ms: int
    block_id: int
    unused: int
    request: RequestTag | None = None


@dataclass(frozen=True, slots=True)
class QuotaSet:
    seq: int
    at_ms: int
    node_id: int
    resource: str
    limit: int | None  # None: no cap
    session_id: int | None
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class LimitSet:
    seq: int
    at_ms: int
    node_id: int
    cls: str
    limit: int | None  # None: no limit
    session_id: int | None
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class DefaultsSet:
    seq: int
    at_ms: int
    node_id: int
    defaults: Defaults | None
    session_id: int | None
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class WeightSet:
    seq: int
    at_ms: int
    node_id: int
    weight: int
    session_id: int | None
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class DeadlineSet:
    seq: int
    at_ms: int
    node_id: int
    deadline_ms: int | None
    session_id: int | None
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class CooldownSet:
    """A named cooldown on a node now ends at `until_ms` (at or before `at_ms`: cleared)."""

    seq: int
    at_ms: int
    node_id: int
    name: str
    until_ms: int
    session_id: int | None
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class NodeEnded:
    """One node reached a terminal state; a cascade is one event per node, top first."""

    seq: int
    at_ms: int
    node_id: int
    state: NodeState
    session_id: int | None
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class LeaseGranted:
    seq: int
    at_ms: int
    lease_id: int
    session_id: int
    node_id: int
    cls: str
    request: RequestTag | None
    waiter_id: int | None  # set when granted from the fair queue; not meaningful on replay


@dataclass(frozen=True, slots=True)
class LeaseEnded:
    seq: int
    at_ms: int
    lease_id: int
    end: LeaseEnd
    latency_ms: int | None
    overloaded: bool
    request: RequestTag | None


@dataclass(frozen=True, slots=True)
class AdaptiveSet:
    seq: int
    at_ms: int
    cls: str
    config: AdaptiveConfig | None


@dataclass(frozen=True, slots=True)
class LimitAdjusted:
    """The AIMD controller moved a root class limit; its samples start afresh."""

    seq: int
    at_ms: int
    cls: str
    limit: int


@dataclass(frozen=True, slots=True)
class PolicyPut:
    """A mesh policy stored as generation ``generation`` of (tenant_id, metric): the fields of
    ``ratemesh.policy.TenantRatePolicy``, flat, so the record says exactly what was stored.
    ``tenant_id`` is the RateKey's tenant part (a descriptor folded in, as the policy's is)."""

    seq: int
    at_ms: int
    tenant_id: str
    metric: str
    generation: int
    target_rate: int
    global_burst: int
    local_burst_cap: int
    enabled: bool
    mode: Mode
    # Records from before it carry none and get the name's (default_unit).
    unit: Unit | None = None
    # Sub-units per unit of a rate not whole per second (`TenantRatePolicy.scale`; the
    # three numbers above are then in sub-units). None for 1: every record before it.
    scale: int | None = None
    # A spend quota's UTC period ("day", "month") and its cap per period; None on
    # every rate policy and on every record before it.
    period: str | None = None
    quota: int | None = None
    # `Posture.SHADOW` for a limit only evaluated and counted; None for enforcing, which
    # every record before it is (and then left out of the record, so a release before it
    # still reads an enforcing put).
    posture: Posture | None = None

    def __post_init__(self) -> None:
        check_metric(self.metric)  # an open name, still one rule: a bad one
        # does not decode (ConfigError is a ValueError)


@dataclass(frozen=True, slots=True)
class PolicyRemoved:
    """(tenant_id, metric) has no policy of its own from generation ``generation`` on."""

    seq: int
    at_ms: int
    tenant_id: str
    metric: str
    generation: int

    def __post_init__(self) -> None:
        check_metric(self.metric)


Event = (
    SessionOpened
    | SessionClosed
    | SessionExpired
    | NodeCreated
    | Charged
    | RateSet
    | CreditGranted
    | CreditReturned
    | QuotaSet
    | LimitSet
    | DefaultsSet
    | WeightSet
    | DeadlineSet
    | CooldownSet
    | NodeEnded
    | LeaseGranted
    | LeaseEnded
    | AdaptiveSet
    | LimitAdjusted
    | PolicyPut
    | PolicyRemoved
)

EVENT_KINDS: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        SessionOpened,
        SessionClosed,
        SessionExpired,
        NodeCreated,
        Charged,
        RateSet,
        CreditGranted,
        CreditReturned,
        QuotaSet,
        LimitSet,
        DefaultsSet,
        WeightSet,
        DeadlineSet,
        CooldownSet,
        NodeEnded,
        LeaseGranted,
        LeaseEnded,
        AdaptiveSet,
        LimitAdjusted,
        PolicyPut,
        PolicyRemoved,
    )
}


# Later fields written only when set, so a record that does not use them stays readable by
# the release before them (it refuses a field it does not know).
_LEFT_OUT_WHEN_NONE: dict[type, tuple[str, ...]] = {
    SessionOpened: ("key_sha256",),
    PolicyPut: ("posture",),
}


def encode_event(event: Event) -> tuple[str, dict[str, Any]]:
    """Return ``(kind, payload)``; the payload is JSON-able and includes ``seq``."""
    cls = type(event)
    kind = cls.__name__
    if EVENT_KINDS.get(kind) is not cls:
        raise TypeError(f"event: not an engine event: {event!r}")
    data: dict[str, Any] = encode_value(cls, event)
    for name in _LEFT_OUT_WHEN_NONE.get(cls, ()):
        if data[name] is None:
            del data[name]
    return kind, data


def decode_event(kind: str, payload: dict[str, Any]) -> Event:
    """Decode one stored event; an unknown kind or a wrong shape refuses to load."""
    cls = EVENT_KINDS.get(kind)
    if cls is None:
        raise UnknownEventKind(f"unknown event kind {kind!r}")
    try:
        event: Event = decode_value(cls, payload)
    except (ValueError, TypeError, KeyError) as exc:
        raise UnknownEventKind(f"event {kind} does not decode: {exc}") from exc
    return event

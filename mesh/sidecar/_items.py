"""What both front ends share: an item checked, decided against the node, and its verdict
as the wire gives it (`verdict_fields`, the one place a Verdict becomes wire data).

An item's mistake (empty tenant, unknown metric, amount <= 0, descriptors the node cannot
use yet) is that item's answer, `error: "field: what was wrong"`, and is never an exception
out of a batch: the rest of the batch is decided as usual. Nothing is decided for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from mesh.core.verdict import Verdict
from mesh.errors import ConfigError

__all__ = [
    "DESCRIPTORS_MAX",
    "NAME_MAX_CHARS",
    "AMOUNT_MAX",
    "Admitter",
    "Decider",
    "Item",
    "Outcome",
    "admit_items",
    "refund_items",
    "verdict_fields",
]

NAME_MAX_CHARS = 256  # a tenant, metric or descriptor key/value; longer is refused per item
DESCRIPTORS_MAX = 16  # (key, value) pairs on one item
AMOUNT_MAX = (1 << 63) - 1  # int64, as the gRPC message carries it
# The fields a Verdict may carry beyond (allowed, reason, mode, bound, suspended): read
# with getattr so that they flow through as soon as mesh.core.verdict has them.
_OPTIONAL = ("limit", "step", "remaining", "retry_after_ms", "reset_after_ms", "stopped")
_INT_FIELDS = frozenset({"limit", "remaining", "retry_after_ms", "reset_after_ms"})


class Admitter(Protocol):
    """What the sidecar asks: `mesh.Mesh` (its hot path, on the node's loop)."""

    def try_admit(self, tenant: str, metric: str, amount: int = 1) -> Verdict: ...

    def charge(self, tenant: str, metric: str, nbytes: int) -> Verdict: ...

    def refund(self, tenant: str, metric: str, amount: int) -> None: ...


class Item(NamedTuple):
    tenant: Any
    metric: Any
    amount: Any = 1
    descriptors: Sequence[tuple[Any, Any]] = ()


# A decided item's Verdict, or why it was not decided ("field: what was wrong").
Outcome = Verdict | str


def verdict_fields(v: Verdict) -> dict[str, Any]:
    """A Verdict as the wire carries it (the JSON body; the gRPC message's fields): absent
    optional fields are left out."""
    out: dict[str, Any] = {
        "allowed": bool(v.allowed),
        "reason": str(v.reason),
        "mode": "" if v.mode is None else str(v.mode),
        "bound": v.bound,
    }
    if v.suspended is not None:
        out["suspended"] = str(v.suspended)
    for name in _OPTIONAL:
        value = getattr(v, name, None)
        if value is None:
            continue
        if name in _INT_FIELDS:
            out[name] = int(value)
        else:
            out[name] = value if isinstance(value, str) else str(value)
    return out


def _takes_descriptors(admitter: Admitter) -> bool:
    try:
        return "descriptors" in inspect.signature(admitter.try_admit).parameters
    except (TypeError, ValueError):
        return False


def _check(item: Item, descriptors_ok: bool) -> str | None:
    """None if `item` may be decided; else "field: what was wrong". The node checks the
    rest (the metric's name, the tenant's type) and says so in a ConfigError."""
    t, m, a = item.tenant, item.metric, item.amount
    if t is None or m is None:
        return f"{'tenant' if t is None else 'metric'}: required"
    if type(t) is not str or not t:
        return f"tenant: must be a non-empty string, got {_show(t)}"
    if len(t) > NAME_MAX_CHARS:
        return f"tenant: longer than {NAME_MAX_CHARS} characters"
    if type(m) is not str or not m:
        return f"metric: must be a non-empty string, got {_show(m)}"
    if len(m) > NAME_MAX_CHARS:
        return f"metric: longer than {NAME_MAX_CHARS} characters"
    if type(a) is not int:
        return f"amount: must be an integer, got {_show(a)}"
    if not 0 < a <= AMOUNT_MAX:
        return f"amount: must be > 0 (and < 2^63), got {a}"
    if item.descriptors:
        if not descriptors_ok:
            return (
                "descriptors: not supported by this node yet (it admits by tenant and "
                "metric); send the item without them"
            )
        if len(item.descriptors) > DESCRIPTORS_MAX:
            return f"descriptors: more than {DESCRIPTORS_MAX} pairs"
        for i, (k, val) in enumerate(item.descriptors):
            for what, s in (("key", k), ("value", val)):
                if type(s) is not str or not s or len(s) > NAME_MAX_CHARS:
                    return (
                        f"descriptors[{i}].{what}: must be a non-empty string of at most "
                        f"{NAME_MAX_CHARS} characters"
                    )
    return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Decider:
    """Decides items against one node; knows once whether the node takes descriptors."""

    def __init__(self, admitter: Admitter) -> None:
        self.admitter = admitter
        self.descriptors_ok = _takes_descriptors(admitter)

    def admit(self, items: Iterable[Item], *, charge: bool = False) -> list[Outcome]:
        return admit_items(self.admitter, items, charge=charge, descriptors_ok=self.descriptors_ok)

    def refund(self, items: Iterable[Item]) -> list[str | None]:
        return refund_items(self.admitter, items, descriptors_ok=self.descriptors_ok)


def admit_items(
    admitter: Admitter, items: Iterable[Item], *, charge: bool = False, descriptors_ok: bool
) -> list[Outcome]:
    """One Outcome per item, in order."""
    call: Any = admitter.charge if charge else admitter.try_admit
    out: list[Outcome] = []
    for t, m, a, ds in items:
        if (  # the common item, checked inline (the checks of `_check`, in one expression)
            ds
            or t.__class__ is not str
            or m.__class__ is not str
            or a.__class__ is not int
            or not (0 < len(t) <= NAME_MAX_CHARS and 0 < len(m) <= NAME_MAX_CHARS)
            or not 0 < a <= AMOUNT_MAX
        ):
            why = _check(Item(t, m, a, ds), descriptors_ok)
            if why is not None:
                out.append(why)
                continue
        try:
            if ds:
                v = call(t, m, a, descriptors=tuple(ds))
            else:
                v = call(t, m, a)
        except ConfigError as exc:  # the node's own check of a name (e.g. an unknown metric)
            out.append(str(exc))
            continue
        out.append(v)
    return out


def refund_items(
    admitter: Admitter, items: Iterable[Item], *, descriptors_ok: bool
) -> list[str | None]:
    """None per item refunded, else why not (nothing was refunded for it)."""
    out: list[str | None] = []
    for row in items:
        item = Item(*row)
        why = _check(item, descriptors_ok)
        if why is None:
            try:
                if item.descriptors:
                    admitter.refund(  # type: ignore[call-arg]
                        item.tenant, item.metric, item.amount, descriptors=tuple(item.descriptors)
                    )
                else:
                    admitter.refund(item.tenant, item.metric, item.amount)
            except ConfigError as exc:
                why = str(exc)
        out.append(why)
    return out

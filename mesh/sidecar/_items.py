"""What both front ends share: an item checked, decided against the node, and its verdict
as the wire gives it (`verdict_fields`, the one place a Verdict becomes wire data).

An item's mistake (empty tenant, a metric no policy of any tenant names and no well-known
name, amount < 0, a bad descriptor) is that item's answer, `error: "field: what was wrong"`,
and is never an exception out of a batch: the rest of the batch is decided as usual. Nothing
is decided for it.

Items are decided with `Mesh.try_admit_detailed`, so every verdict on the wire carries the
numbers a caller acts on (`remaining`, `retry_after_ms`, `reset_after_ms`). A descriptor
(one key=value pair under the tenant, docs/policies.md) narrows the tenant the way
`mesh.descriptor_tenant` does in process. Amount 0 is a peek: the numbers one unit would
see now, nothing charged (`Mesh.peek_numbers`; Gubernator's hits=0).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from mesh.core.verdict import Numbers, QuotaLag, Reason, Verdict
from mesh.errors import ConfigError
from ratemesh.errors import RatemeshError
from ratemesh.policy import Metric, TenantRatePolicy, descriptor_tenant
from ratemesh.rates import rate_text, rate_window

__all__ = [
    "DESCRIPTORS_MAX",
    "NAME_MAX_CHARS",
    "AMOUNT_MAX",
    "Admitter",
    "Decided",
    "Decider",
    "Item",
    "Outcome",
    "admit_items",
    "limit_fields",
    "refund_items",
    "shared_fields",
    "verdict_fields",
]

NAME_MAX_CHARS = 256  # a tenant, metric or descriptor key/value; longer is refused per item
# (key, value) pairs on one item: one level under the tenant, as policies declare them.
DESCRIPTORS_MAX = 1
AMOUNT_MAX = (1 << 63) - 1  # int64, as the gRPC message carries it


class Admitter(Protocol):
    """What the sidecar asks: `mesh.Mesh` (on the node's loop)."""

    def try_admit_numbers_many(
        self, rows: list[tuple[str, str, int]]
    ) -> list[tuple[Verdict, Numbers | None] | ConfigError]: ...

    def refund(self, tenant: str, metric: str, amount: int) -> None: ...

    def report_429(self, tenant: str, metric: str, cooldown_s: float = 90.0) -> None: ...

    def clear_429(self, tenant: str, metric: str) -> bool: ...

    def policy_known(self, tenant: str, metric: str) -> bool: ...

    def policy_for(self, tenant: str, metric: str) -> TenantRatePolicy | None: ...

    def metric_declared(self, metric: str) -> bool: ...

    def peek_numbers(self, tenant: str, metric: str) -> tuple[Verdict, Numbers | None]: ...


class Item(NamedTuple):
    tenant: Any
    metric: Any
    amount: Any = 1
    descriptors: Sequence[tuple[Any, Any]] = ()


# A decided item's (shared verdict, its view's numbers), or why it was not decided
# ("field: what was wrong"). Not a detailed Verdict: a batch item then costs no Verdict of
# its own, and the shared part's encoding is memoised (mesh.sidecar._grpc).
Decided = tuple[Verdict, Numbers | None]
Outcome = Decided | str


def verdict_fields(v: Verdict, n: Numbers | None = None) -> dict[str, Any]:
    """A Verdict, with the numbers `n` if given (else its own), as the wire carries it (the
    JSON body; the gRPC message's fields): enums as their values, None fields left out
    (proto3 `optional`: absent)."""
    out = shared_fields(v)
    if n is None:
        n = Numbers(v.remaining, v.retry_after_ms, v.reset_after_ms)
    if n.remaining is not None:
        out["remaining"] = n.remaining
    if n.retry_after_ms is not None:
        out["retry_after_ms"] = n.retry_after_ms
    if n.reset_after_ms is not None:
        out["reset_after_ms"] = n.reset_after_ms
    if v.quota is not None:  # a detailed spend-quota verdict (docs/quotas.md)
        out["quota"] = quota_fields(v.quota)
    return out


def limit_fields(p: TenantRatePolicy) -> dict[str, Any]:
    """The policy's exact limit beside a verdict's `limit` (units per second, rounded down:
    0 for "1/minute"): as text (`rate`, "1/minute"), as a whole amount per whole period
    (`window`, what RateLimit-Policy's q and w carry) and its `burst` in units. A spend
    quota has no rate: nothing (its verdict carries `quota`)."""
    if p.quota is not None:
        return {}
    amount, period_s = rate_window(p.target_rate, p.scale)
    return {
        "rate": rate_text(p.target_rate, p.scale),
        "window": {"amount": amount, "period_s": period_s},
        "burst": p.burst_units,
    }


def quota_fields(q: QuotaLag) -> dict[str, int]:
    """A spend quota's disclosed numbers as the wire carries them (lag_ms absent: no fold)."""
    return {k: x for k, x in q._asdict().items() if x is not None}


def shared_fields(v: Verdict) -> dict[str, Any]:
    """The fields a shared verdict carries (all but the per-moment numbers)."""
    out: dict[str, Any] = {
        "allowed": v.allowed,
        "reason": v.reason.value,
        "mode": "" if v.mode is None else v.mode.value,
        "bound": v.bound,
    }
    if v.suspended is not None:
        out["suspended"] = v.suspended.value
    if v.limit is not None:
        out["limit"] = v.limit
    if v.step is not None:
        out["step"] = v.step.value
    if v.shadow:  # a limit in shadow posture (docs/policies.md)
        out["shadow"] = True
        if v.would_deny_reason is not None:
            out["would_deny_reason"] = v.would_deny_reason.value
    return out


def _check(item: Item, *, peek: bool = False) -> str | None:
    """None if `item` may be decided (with `peek`, amount 0 too); else "field: what was
    wrong". The node checks the rest (the metric's name, the tenant's type) and says so in
    a ConfigError."""
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
    if peek and not 0 <= a <= AMOUNT_MAX:
        return f"amount: must be >= 0 (0: a peek, nothing charged) and < 2^63, got {a}"
    if not peek and not 0 < a <= AMOUNT_MAX:
        return f"amount: must be > 0 (and < 2^63), got {a}"
    if item.descriptors:
        if len(item.descriptors) > DESCRIPTORS_MAX:
            return (
                f"descriptors: at most {DESCRIPTORS_MAX} (key, value) pair under the tenant, "
                f"got {len(item.descriptors)}"
            )
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
    """Decides items against one node."""

    def __init__(self, admitter: Admitter) -> None:
        self.admitter = admitter

    def admit(self, items: Iterable[Item], *, charge: bool = False) -> list[Outcome]:
        """`charge` names the call (Charge pre-charges bytes or tokens); the decision is
        the same one, `amount` units of the metric."""
        return admit_items(self.admitter, items)

    def refund(self, items: Iterable[Item]) -> list[str | None]:
        return refund_items(self.admitter, items)

    def policy(self, item: Item) -> TenantRatePolicy | None:
        """The policy that decided `item` (an item already decided: its names are valid)."""
        try:
            return self.admitter.policy_for(_tenant(item.tenant, item.descriptors), item.metric)
        except (ConfigError, RatemeshError):
            return None

    def cooldown(
        self, tenant: Any, metric: Any, cooldown_s: Any, *, max_s: float = 3600.0
    ) -> str | None:
        """The fleet's 429 cooldown for (tenant, metric) (docs/cooldown.md), at most `max_s`
        and only for a limit with a policy here; None, or why not (nothing changed)."""
        why = self._limit(tenant, metric)
        if why is not None:
            return why
        if isinstance(cooldown_s, bool) or not isinstance(cooldown_s, (int, float)):
            return f"cooldown_s: must be a number of seconds, got {_show(cooldown_s)}"
        if not 0 < cooldown_s <= max_s:
            return (
                f"cooldown_s: must be in (0, {max_s:g}] (sidecar.cooldown_max_s), got {cooldown_s}"
            )
        try:
            self.admitter.report_429(tenant, metric, cooldown_s)
        except ConfigError as exc:
            return str(exc)
        return None

    def clear_cooldown(self, tenant: Any, metric: Any) -> str | None:
        """End (tenant, metric)'s cooldown on this node (and at its owner if this node owns
        it); None, or why not."""
        why = self._limit(tenant, metric)
        if why is not None:
            return why
        if not self.admitter.clear_429(tenant, metric):
            return f"tenant, metric: {tenant}/{metric} is not cooling down here"
        return None

    def _limit(self, tenant: Any, metric: Any) -> str | None:
        """Why (tenant, metric) may not be cooled, or None: a limit with a policy."""
        if type(tenant) is not str or not 0 < len(tenant) <= NAME_MAX_CHARS:
            return f"tenant: must be a non-empty string of at most {NAME_MAX_CHARS} characters"
        if type(metric) is not str or not 0 < len(metric) <= NAME_MAX_CHARS:
            return f"metric: must be a non-empty string of at most {NAME_MAX_CHARS} characters"
        try:
            known = self.admitter.policy_known(tenant, metric)
        except ConfigError as exc:
            return str(exc)
        if not known:
            return f"tenant, metric: no policy for {_show(tenant)}/{_show(metric)} on this node"
        return None


def _tenant(tenant: str, descriptors: Sequence[tuple[Any, Any]]) -> str:
    """The RateKey tenant part: the tenant, narrowed by its descriptor if it has one."""
    if not descriptors:
        return tenant
    return descriptor_tenant(tenant, tuple(descriptors[0]), field="descriptors[0]")


def admit_items(admitter: Admitter, items: Iterable[Item]) -> list[Outcome]:
    """One Outcome per item, in order: the items are checked here, and the valid ones
    decided in one call to the node (one take of its lock for the batch); a peek (amount
    0) is answered in its place in that order, after what came before it is decided."""
    out: list[Outcome | None] = []
    rows: list[tuple[str, str, int]] = []
    at: list[int] = []  # where each row's answer goes in `out`
    for t, m, a, ds in items:
        if (  # the common item, checked inline (the checks of `_check`, in one expression)
            ds
            or t.__class__ is not str
            or m.__class__ is not str
            or a.__class__ is not int
            or not (0 < len(t) <= NAME_MAX_CHARS and 0 < len(m) <= NAME_MAX_CHARS)
            or not 0 < a <= AMOUNT_MAX
        ):
            why = _check(Item(t, m, a, ds), peek=True)
            if why is not None:
                out.append(why)
                continue
            if ds:
                try:
                    t = _tenant(t, ds)
                except RatemeshError as exc:
                    out.append(str(exc))
                    continue
            if a == 0:
                _decide(admitter, rows, at, out)
                out.append(_peek(admitter, t, m))
                continue
        at.append(len(out))
        out.append(None)
        rows.append((t, m, a))
    _decide(admitter, rows, at, out)
    return out  # type: ignore[return-value]  # every None was filled in


def _decide(
    admitter: Admitter, rows: list[tuple[str, str, int]], at: list[int], out: list[Outcome | None]
) -> None:
    """Decide `rows` into their places `at` in `out`, and empty both."""
    if not rows:
        return
    unknown = Reason.POLICY_UNKNOWN
    for k, answer in enumerate(admitter.try_admit_numbers_many(rows)):
        if answer.__class__ is tuple and answer[0].reason is not unknown:
            out[at[k]] = answer
        elif isinstance(answer, ConfigError):
            out[at[k]] = str(answer)
        else:  # policy_unknown: a typo's metric is said, not answered so
            out[at[k]] = _unknown_metric(admitter, rows[k][1]) or answer
    rows.clear()
    at.clear()


def _peek(admitter: Admitter, tenant: str, metric: str) -> Outcome:
    try:
        answer = admitter.peek_numbers(tenant, metric)
    except ConfigError as exc:
        return str(exc)
    if answer[0].reason is Reason.POLICY_UNKNOWN:
        return _unknown_metric(admitter, metric) or answer
    return answer


_WELL_KNOWN = frozenset(m.value for m in Metric)


def _unknown_metric(admitter: Admitter, metric: str) -> str | None:
    """Why `metric` is refused when no policy covers it: no policy of any tenant names it
    and it is no well-known name, so a typo (read_lops) is said, not answered
    policy_unknown. None for a real metric with no policy for this tenant yet."""
    if metric in _WELL_KNOWN or admitter.metric_declared(metric):
        return None
    return (
        f"metric: unknown metric {_show(metric)}: no policy of any tenant names it here, "
        f"nor is it a well-known name ({', '.join(sorted(_WELL_KNOWN))})"
    )


def refund_items(admitter: Admitter, items: Iterable[Item]) -> list[str | None]:
    """None per item refunded, else why not (nothing was refunded for it)."""
    out: list[str | None] = []
    for row in items:
        item = Item(*row)
        why = _check(item)
        if why is None:
            try:
                admitter.refund(_tenant(item.tenant, item.descriptors), item.metric, item.amount)
            except (ConfigError, RatemeshError) as exc:
                why = str(exc)
        out.append(why)
    return out

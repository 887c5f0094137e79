"""Edits of a node's settings: caps, limits, rates, defaults, weight, deadline, cooldowns, and
the operator's AIMD on a root limit.

Every edit is one event through ``_edit``: the caller's scope is checked (a session may not edit
its own scope node), a resend under the same request id gets the first answer, and the fair
queue is dispatched after, since a raised limit can let waiters in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _events as ev
from ._core import Core, _ident, _int, _name
from ._credit import check_rate
from ._errors import InvalidArgument
from ._housekeeping import Housekeeping
from ._leasebook import LeaseBook
from ._types import AdaptiveConfig, Defaults, Edited, Rate, RequestTag

__all__ = ["COOLDOWN_MS_MAX", "COOLDOWNS_PER_NODE_MAX", "Edits"]

COOLDOWN_MS_MAX = 86_400_000  # a day: a cooldown is a back-off, not a switch
COOLDOWNS_PER_NODE_MAX = 64  # live named cooldowns one node holds

# the events that set one setting of a node: (seq, at_ms, node_id, *values, session_id, tag)
_Setting = Callable[..., ev.Event]


class Edits:
    """The edit calls; each is one event, checked and recorded the same way."""

    def __init__(self, core: Core, clock: Housekeeping, leases: LeaseBook) -> None:
        self._core = core
        self._clock = clock
        self._leases = leases

    def set_quota(
        self,
        session_id: int | None,
        node_id: int,
        resource: str,
        limit: int | None,
        request_id: str | None = None,
    ) -> Edited:
        """Set (or with ``None`` remove) a cap; lowering it below usage takes nothing back."""
        _name("resource", resource)
        if limit is not None:
            _int("limit", limit)
        return self._set("quota", ev.QuotaSet, session_id, node_id, request_id, resource, limit)

    def set_limit(
        self,
        session_id: int | None,
        node_id: int,
        cls: str,
        limit: int | None,
        request_id: str | None = None,
    ) -> Edited:
        """Set (or remove) a concurrency limit; lowering it revokes no lease."""
        _name("cls", cls)
        if limit is not None:
            _int("limit", limit)
        return self._set("limit", ev.LimitSet, session_id, node_id, request_id, cls, limit)

    def set_rate(
        self,
        session_id: int | None,
        node_id: int,
        resource: str,
        rate: Rate | None,
        request_id: str | None = None,
    ) -> Edited:
        """Set (or with ``None`` remove) a node's rate for ``resource``. Lowering the burst
        below what is outstanding takes nothing back; the bucket refills once it drains."""
        _name("resource", resource)
        if rate is not None:
            check_rate("rate", rate)
        return self._set("rate", ev.RateSet, session_id, node_id, request_id, resource, rate)

    def set_defaults(
        self,
        session_id: int | None,
        node_id: int,
        defaults: Defaults | None,
        request_id: str | None = None,
    ) -> Edited:
        if defaults is not None and not isinstance(defaults, Defaults):
            raise InvalidArgument("defaults", "must be a Defaults or None")
        return self._set("defaults", ev.DefaultsSet, session_id, node_id, request_id, defaults)

    def set_weight(
        self, session_id: int | None, node_id: int, weight: int, request_id: str | None = None
    ) -> Edited:
        _int("weight", weight, 1)
        return self._set("weight", ev.WeightSet, session_id, node_id, request_id, weight)

    def set_deadline(
        self,
        session_id: int | None,
        node_id: int,
        deadline_ms: int | None,
        request_id: str | None = None,
    ) -> Edited:
        if deadline_ms is not None:
            _int("deadline_ms", deadline_ms)
        return self._set("deadline", ev.DeadlineSet, session_id, node_id, request_id, deadline_ms)

    def set_cooldown(
        self,
        session_id: int | None,
        node_id: int,
        name: str,
        duration_ms: int,
        *,
        replace: bool = False,
        request_id: str | None = None,
    ) -> Edited:
        """Back callers of `name` off until now + `duration_ms`. A cooldown only grows
        (a later, shorter one keeps the longer end) unless `replace` (the operator's `gov
        cooldown`; 0 with replace clears it)."""
        _name("name", name)
        if type(duration_ms) is not int or not 0 <= duration_ms <= COOLDOWN_MS_MAX:
            raise InvalidArgument("duration_ms", f"must be 0..{COOLDOWN_MS_MAX} ms")
        core = self._core
        node = core.state.nodes.get(_ident("node_id", node_id))
        if node is not None:
            now = core.now()
            live = {k for k, v in node.cooldowns.items() if v > now}
            if name not in live and len(live) >= COOLDOWNS_PER_NODE_MAX:
                raise InvalidArgument(
                    "name", f"node {node_id} has {COOLDOWNS_PER_NODE_MAX} live cooldowns"
                )

        def make(seq: int, now: int, tag: RequestTag | None) -> ev.Event:
            current = core.state.nodes[node_id].cooldowns.get(name, 0)
            until = now + duration_ms if replace else max(current, now + duration_ms)
            return ev.CooldownSet(seq, now, node_id, name, until, session_id, tag)

        return self._edit(
            session_id, node_id, request_id, ("cooldown", node_id, name, duration_ms, replace), make
        )

    def set_adaptive(self, cls: str, config: AdaptiveConfig | None) -> None:
        """Operator only: run AIMD on the root limit of ``cls`` (``None`` stops it)."""
        now = self._clock.advance()
        _name("cls", cls)
        if config is not None:
            if not isinstance(config, AdaptiveConfig):
                raise InvalidArgument("config", "must be an AdaptiveConfig")
            _int("config.min_limit", config.min_limit)
            _int("config.max_limit", config.max_limit, config.min_limit)
            _int("config.initial_limit", config.initial_limit, config.min_limit)
            if config.initial_limit > config.max_limit:
                raise InvalidArgument("config.initial_limit", "must be <= max_limit")
            _int("config.interval_ms", config.interval_ms, 1)
            _int("config.min_samples", config.min_samples, 1)
        core = self._core
        core.emit(ev.AdaptiveSet(core.seq(), now, cls, config))
        self._leases.dispatch()

    def _set(
        self,
        kind: str,
        event: _Setting,
        session_id: int | None,
        node_id: int,
        request_id: str | None,
        *values: Any,
    ) -> Edited:
        """One setting's edit: its fingerprint is (kind, node_id, *values), and its event
        carries the values between the node and the caller."""
        return self._edit(
            session_id,
            node_id,
            request_id,
            (kind, node_id, *values),
            lambda seq, now, tag: event(seq, now, node_id, *values, session_id, tag),
        )

    def _edit(
        self,
        session_id: int | None,
        node_id: int,
        request_id: str | None,
        fp: tuple[Any, ...],
        make: Callable[[int, int, RequestTag | None], ev.Event],
    ) -> Edited:
        now = self._clock.advance()
        core = self._core
        session = core.caller(session_id)
        tag, hit = core.recall(session, request_id, fp)
        if hit is not None:
            return hit  # type: ignore[return-value]
        node = core.resolve(session, node_id, edit=True)
        core.emit(make(core.seq(), now, tag))
        self._clock.advance()
        self._leases.dispatch()
        return Edited(node.id)

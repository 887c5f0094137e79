"""governord as the mesh's policy coordinator: the engine calls that put and remove policies.

A put is one ``PolicyPut`` event through the same emit path as every other change, so it is
durable before the caller hears back (the driver waits for the commit) and replays on restart.
The rules that keep a generation meaning one thing, on governord and on every node:

* a put without a generation gets the key's last generation + 1;
* a put naming its generation must name one above the key's last (gaps are allowed, so a
  node's file numbering can be adopted), or one already stored with the same values (a no-op);
  anything else is refused with ``GenerationConflict``, at the pusher, not at the nodes;
* a put whose values equal the key's current policy is a no-op (a re-apply adds nothing);
* ``expect_generation`` is the key's last generation the pusher computed its change against
  (0: none); another writer's put in between refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ratemesh.checks import INT_MAX
from ratemesh.policy import METRIC_NAME, METRICS_MAX, Posture, TenantRatePolicy, scope_name

from . import _events as ev
from ._core import Core, _int
from ._errors import GenerationConflict, InvalidArgument, NotFound
from ._housekeeping import Housekeeping
from ._policybook import POLICY_KEYS_MAX, PolicyKey

__all__ = ["Policies", "PolicyPutResult"]


@dataclass(frozen=True, slots=True)
class PolicyPutResult:
    """The stored policy and whether this put created it (False: it was already there)."""

    policy: TenantRatePolicy
    created: bool


class Policies:
    """The mesh policies governord coordinates, one book of generations per key."""

    def __init__(self, core: Core, clock: Housekeeping) -> None:
        self._core = core
        self._clock = clock

    def put_policy(
        self,
        policy: TenantRatePolicy,
        *,
        allocate: bool,
        expect_generation: int | None = None,
    ) -> PolicyPutResult:
        """Store ``policy`` as a generation of its key; ``allocate`` ignores its generation
        and takes the next one. Refusals change nothing."""
        now = self._clock.advance()
        core = self._core
        if not isinstance(policy, TenantRatePolicy):
            raise InvalidArgument("policy", "must be a TenantRatePolicy")
        scope = (policy.tenant_id, policy.metric)
        key = core.state.policies.keys.get(scope)
        last = 0 if key is None else key.last.generation
        self._check_expected(policy.tenant_id, policy.metric, last, expect_generation)
        self._check_unit(policy)
        current = None if key is None else key.current
        if allocate:
            if current is not None and current.values() == policy.values():
                return PolicyPutResult(current, False)
            generation = last + 1
        else:
            generation = policy.generation
            same = self._same_generation(key, policy)
            if same is not None:
                return PolicyPutResult(same, False)
            if generation <= last:
                raise GenerationConflict(
                    "generation",
                    f"{_name(policy)}: generation {generation} is not above the last, "
                    f"{last}; a change needs a new generation (leave generation out and "
                    f"governord gives it {last + 1})",
                )
        if generation > INT_MAX:
            raise InvalidArgument(
                "generation", f"{_name(policy)} has used every generation up to {INT_MAX}"
            )
        if key is None and len(core.state.policies.keys) >= POLICY_KEYS_MAX:
            raise InvalidArgument(
                "policy", f"governord holds {POLICY_KEYS_MAX} policy keys (POLICY_KEYS_MAX)"
            )
        p = policy
        core.emit(
            ev.PolicyPut(
                core.seq(),
                now,
                p.tenant_id,
                p.metric,
                generation,
                p.target_rate,
                p.global_burst,
                p.local_burst_cap,
                p.enabled,
                p.mode,
                p.unit,
                None if p.scale == 1 else p.scale,
                None if p.period is None else p.period.value,
                p.quota,
                None if p.posture is Posture.ENFORCE else p.posture,
            )
        )
        stored = core.state.policies.keys[scope].current
        assert stored is not None and stored.generation == generation
        return PolicyPutResult(stored, True)

    def remove_policy(
        self, tenant_id: str, metric: str, *, expect_generation: int | None = None
    ) -> int:
        """Remove the key's own policy: a tombstone at its last generation + 1 (returned)."""
        now = self._clock.advance()
        core = self._core
        if not isinstance(metric, str) or not METRIC_NAME.fullmatch(metric):
            raise InvalidArgument("metric", "must be a metric name")
        key = core.state.policies.keys.get((tenant_id, metric))
        if key is None or key.current is None:
            raise NotFound("tenant_id", f"{scope_name(tenant_id, metric)} has no policy to remove")
        last = key.last.generation
        self._check_expected(tenant_id, metric, last, expect_generation)
        if last >= INT_MAX:
            raise InvalidArgument(
                "generation", f"{scope_name(tenant_id, metric)} has no generation left"
            )
        core.emit(ev.PolicyRemoved(core.seq(), now, tenant_id, metric, last + 1))
        return last + 1

    def _check_unit(self, policy: TenantRatePolicy) -> None:
        """One unit per metric across the stored policies, and a bound on names."""
        metrics: set[str] = set()
        for (tenant_id, metric), key in self._core.state.policies.keys.items():
            other = key.current
            metrics.add(metric)
            if other is None or metric != policy.metric or tenant_id == policy.tenant_id:
                continue
            if other.unit is not policy.unit:
                raise InvalidArgument(
                    "unit",
                    f"metric {policy.metric!r} is counted in {other.unit.value} by "
                    f"{_name(other)} generation {other.generation}; {_name(policy)} says "
                    f"{policy.unit.value}: a metric has one unit",
                )
        if policy.metric not in metrics and len(metrics) >= METRICS_MAX:
            raise InvalidArgument(
                "metric", f"governord holds {METRICS_MAX} metric names (METRICS_MAX)"
            )

    @staticmethod
    def _check_expected(
        tenant_id: str, metric: str, last: int, expect_generation: int | None
    ) -> None:
        if expect_generation is None:
            return
        _int("expect_generation", expect_generation)
        if expect_generation != last:
            raise GenerationConflict(
                "expect_generation",
                f"{scope_name(tenant_id, metric)} is at generation {last}, "
                f"not {expect_generation}: "
                "another change came first; read it again and re-apply",
            )

    @staticmethod
    def _same_generation(
        key: PolicyKey | None, policy: TenantRatePolicy
    ) -> TenantRatePolicy | None:
        """The stored policy under ``policy.generation`` if it has the same values; a
        different one there is a conflict (the number would mean two things)."""
        if key is None:
            return None
        record = key.find(policy.generation)
        if record is None:
            return None
        if record.policy is not None and record.policy == policy:
            return record.policy
        what = "a removal" if record.policy is None else "other values"
        raise GenerationConflict(
            "generation",
            f"{_name(policy)}: generation {policy.generation} is already {what} at governord; "
            "a node that loads this policy would refuse governord's (leave generation out and "
            f"governord gives it {key.last.generation + 1})",
        )


def _name(policy: TenantRatePolicy) -> str:
    return scope_name(policy.tenant_id, policy.metric)

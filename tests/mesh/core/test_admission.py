"""The hot path and its modes: local, share, global (bootstrap), strict, disabled, unknown."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import pytest

from mesh import admit
from mesh.core.admission import Admission
from mesh.core.config import CoreConfig
from mesh.core.messages import RateSnapshot, SnapshotBatch
from mesh.core.policy import BOUNDS, DEFAULT_TENANT, Mode
from mesh.core.reporter import Reporter
from mesh.core.ring import Ring
from mesh.core.verdict import Reason, Suspension
from mesh.errors import ConfigError, ConfigTypeError
from tests.mesh._helpers import MS, cache, policy


def admit_n(a: Admission, n: int, tenant: str = "t", metric: str = "read_iops") -> int:
    return sum(a.try_admit(tenant, metric).allowed for _ in range(n))


def test_local_mode_is_a_gcra_in_this_process() -> None:
    a = Admission(cache(policy(rate=100, burst=10, mode="local")), 0)
    assert admit_n(a, 20) == 10
    v = a.try_admit("t", "read_iops")
    assert (v.allowed, v.reason, v.mode, v.bound) == (
        False,
        Reason.RATE_LIMITED,
        Mode.LOCAL,
        "fleet<=N*limit",
    )
    a.tick(50 * MS)
    assert admit_n(a, 20) == 5  # 50 ms at 100/s
    a.tick(150 * MS)
    assert admit_n(a, 20) == 10
    a.tick(10_000 * MS)
    assert admit_n(a, 20) == 10  # never more than the burst


def test_share_mode_splits_by_live_members_and_discloses_stale_membership() -> None:
    a = Admission(cache(policy(rate=1000, burst=100, mode="share")), 0, n_live=4)
    assert admit_n(a, 100) == 25  # ceil(100 / 4)
    assert a.try_admit("t", "read_iops").bound == BOUNDS["share"]
    a.membership(4, True, 0)  # the membership source is unreachable: N decays to 1
    a.tick(1000 * MS)
    v = a.try_admit("t", "read_iops")
    assert v.allowed and v.suspended is Suspension.MEMBERSHIP_STALE
    assert v.bound == BOUNDS["share_stale"]
    assert admit_n(a, 200) == 99
    a.membership(3, False, 2000 * MS)
    a.tick(4000 * MS)
    assert admit_n(a, 100) == 34 and a.try_admit("t", "read_iops").suspended is None


def test_unknown_policy_is_refused_and_named() -> None:
    a = Admission(cache(policy("known", mode="local")), 0)
    v = a.try_admit("stranger", "read_iops")
    assert not v.allowed and v.reason is Reason.POLICY_UNKNOWN
    assert v.suspended is Suspension.POLICY_UNKNOWN
    # Learning the policy later makes the tenant admissible.
    a.policies.put(policy("stranger", mode="local"))
    a.tick(MS)
    assert a.try_admit("stranger", "read_iops").allowed


def test_default_tenant_policy_meters_each_tenant_apart() -> None:
    a = Admission(cache(policy(DEFAULT_TENANT, rate=10, burst=3, mode="local")), 0)
    assert admit_n(a, 10, "x") == 3 and admit_n(a, 10, "y") == 3


def test_strict_is_reserved_and_fails_closed() -> None:
    a = Admission(cache(policy(mode="strict")), 0)
    v = a.try_admit("t", "read_iops")
    assert not v.allowed and v.suspended is Suspension.GOVERNOR_UNREACHABLE
    assert v.bound == BOUNDS["strict"]


def test_disabled_policy_admits_and_says_so() -> None:
    a = Admission(cache(policy(enabled=False, burst=1)), 0)
    assert admit_n(a, 1000) == 1000
    assert a.try_admit("t", "read_iops").bound == BOUNDS["disabled"]


def test_global_without_a_mesh_fails_closed() -> None:
    v = Admission(cache(policy()), 0).try_admit("t", "read_iops")
    assert not v.allowed and v.suspended is Suspension.OWNER_UNREACHABLE


def test_an_amount_larger_than_the_burst_is_too_large_not_rate_limited() -> None:
    a = Admission(cache(policy(burst=10, mode="local")), 0)
    v = a.try_admit("t", "read_iops", 11)
    assert not v.allowed and v.reason is Reason.TOO_LARGE


@pytest.mark.parametrize(
    "args, exc, field",
    [
        (("t", "read_iops", 0), ConfigError, "amount"),
        (("t", "read_iops", -3), ConfigError, "amount"),
        (("t", "read_iops", 1.5), ConfigTypeError, "amount"),
        (("t", "read_iops", "1"), ConfigTypeError, "amount"),
        (("t", "Reads!"), ConfigError, "metric"),
        (("t", 5), ConfigTypeError, "metric"),
        ((None, "read_iops"), ConfigTypeError, "tenant"),
    ],
)
def test_bad_arguments_raise_and_change_nothing(
    args: tuple[Any, ...], exc: type[ConfigError], field: str
) -> None:
    a = Admission(cache(policy(burst=10, mode="local")), 0)
    assert admit_n(a, 3) == 3
    with pytest.raises(exc) as info:
        a.try_admit(*args)
    assert info.value.field == field
    assert admit_n(a, 20) == 7  # the failed call took nothing


def test_refund_checks_its_arguments() -> None:
    a = Admission(cache(policy(mode="local")), 0)
    with pytest.raises(ConfigError, match="tenant"):
        a.refund("nobody", "read_iops", 1)
    with pytest.raises(ConfigError, match="amount"):
        a.refund("t", "read_iops", 0)


def test_verdicts_are_shared_values() -> None:
    a = Admission(cache(policy("a", mode="local"), policy("b", mode="local")), 0)
    assert a.try_admit("a", "read_iops") is a.try_admit("b", "read_iops")


def test_the_hot_path_retains_no_memory() -> None:
    a = Admission(cache(policy(rate=10**9, burst=10**9, b=10**9, mode="local")), 0)
    a.try_admit("t", "read_iops")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20_000):
            a.try_admit("t", "read_iops")
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1024


# -- admit(): the bounded wait ------------------------------------------------------------------


def global_worker(queue_max: int = 1024) -> tuple[Reporter, Admission]:
    cfg = CoreConfig(tenant_queue_max=queue_max)
    r = Reporter("w", 1, Ring(["w"], 1), config=cfg)
    return r, Admission(cache(policy(b=4)), 0, reporter=r)


def grant(r: Reporter, a: Admission, remaining: int, version: int, ack: int) -> None:
    key = policy(b=4).rate_key
    r.flush(0)
    r.receive(0, SnapshotBatch.of("w", 1, (RateSnapshot(key, 1, version, remaining, 0, ack, 1),)))
    a.service(0)


def test_admit_waits_for_capacity_and_keeps_order() -> None:
    async def main() -> None:
        r, a = global_worker()
        assert admit_n(a, 10) == 4  # the bootstrap allowance
        waiters = [asyncio.create_task(admit(a, "t", "read_iops", timeout_s=5)) for _ in range(3)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters)
        grant(r, a, 2, 1, ack=1)  # the 4 are applied; room for two more
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert [w.done() for w in waiters] == [True, True, False]
        assert all(w.result().allowed for w in waiters[:2])
        waiters[2].cancel()

    asyncio.run(main())


def test_admit_rejects_at_its_deadline_and_when_the_queue_is_full() -> None:
    async def main() -> None:
        r, a = global_worker(queue_max=2)
        admit_n(a, 10)
        first = asyncio.create_task(admit(a, "t", "read_iops", timeout_s=0.01))
        second = asyncio.create_task(admit(a, "t", "read_iops", timeout_s=5))
        await asyncio.sleep(0)
        full = await admit(a, "t", "read_iops", timeout_s=5)
        assert full.reason is Reason.QUEUE_FULL
        late = await first
        assert not late.allowed and late.reason is Reason.DEADLINE_EXCEEDED
        second.cancel()

    asyncio.run(main())


def test_admit_for_an_unknown_policy_answers_at_once_with_the_real_reason() -> None:
    """Waiting cannot make a policy known: `policy_unknown` comes back at once,
    suspended, not `deadline_exceeded` after the whole timeout; once the generation is
    known, the same call admits."""

    async def main() -> None:
        a = Admission(cache(), 0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        v = await admit(a, "nobody", "read_iops", timeout_s=5)
        assert loop.time() - t0 < 0.5, "it must not wait for the deadline"
        assert v.reason is Reason.POLICY_UNKNOWN and v.suspended is Suspension.POLICY_UNKNOWN
        assert v.retry_after_ms is None and len(a.queues) == 0
        a.policies.put(policy("nobody", mode="local"))
        a.tick(MS)
        assert (await admit(a, "nobody", "read_iops", timeout_s=5)).allowed

    asyncio.run(main())


def test_views_are_bounded_and_idle_ones_are_forgotten() -> None:
    cfg = CoreConfig(views_max=3)
    r = Reporter("w", 1, Ring(["w"], 1), config=cfg)
    a = Admission(cache(policy(DEFAULT_TENANT, b=8)), 0, reporter=r, config=cfg)
    for t in ("a", "b", "c"):
        assert a.try_admit(t, "read_iops").allowed
    for e in [r.flush(0)]:
        assert e  # the three keys' reports went out
    a.tick(100 * MS)  # unacknowledged: the views are stale and must be kept
    a.try_admit("d", "read_iops")
    assert a.gate_count == 4 and len(r.gates) == 4
    for v in list(r.gates.values()):  # the owner acknowledges everything
        r.receive(
            200 * MS,
            SnapshotBatch.of("w", 1, (RateSnapshot(v.key, 1, 1, 8, 0, v.next_sequence - 1, 1),)),
        )
    r.flush(200 * MS)
    a.tick(400 * MS)  # idle now: back to bootstrap, nothing held
    a.try_admit("e", "read_iops")
    assert a.gate_count <= 3 and len(r.gates) <= 3
    assert a.try_admit("a", "read_iops").allowed  # rebuilt on use

"""The global mode's fleet envelope, checked on real members from outside.

Over every interval [t0, t1], the units all workers admitted must stay within
`R*(t1-t0) + B + N*b + R*d`. Each test records every admission's instant at the caller
(`time.monotonic_ns`) and hands the history to an independent checker
(tests/mesh/_envelope.py), which knows nothing of the mesh's own counters.

* Traffic that migrates between members and back, with an idle longer than `views_idle_ms`
  on the member it comes back to: embedded `Mesh` members on loopback gRPC.
* Random adversarial schedules (migrations, on/off bursts, idles below and past the snapshot
  TTL and `views_idle_ms`, amounts from 1 to above b and B) through `mesh node` processes'
  sidecar gRPC API, each schedule on its own tenant; every one printed with its seed.

d, the propagation delay in `N*b + R*d`, is taken generously: two sync intervals plus the
worst report-to-acknowledgement delay any member reports on /health (`d_ms`), plus the
caller's worst round trip to the sidecar (an admission's instant is known to that much).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from mesh.node import Mesh
from tests.mesh._envelope import NS, Admission, violations, worst_interval
from tests.mesh._util import static_nodes, until

pytestmark = pytest.mark.slow  # real gRPC between members, seconds of traffic

SYNC_MS = 5
METRIC = "read_iops"


def _owned_by(owner: str, ids: list[str], prefix: str) -> str:
    """A tenant name whose key the ring gives to `owner` (static membership, one ring)."""
    ring = Ring(ids, 1)
    for k in range(1000):
        if ring.owner_of(RateKey(f"{prefix}{k}", Metric.READ_IOPS, 1)) == owner:
            return f"{prefix}{k}"
    raise AssertionError(f"no tenant owned by {owner}")


async def _offer(node: Mesh, tenant: str, rate: float, seconds: float, out: list[Admission]) -> int:
    """Offer `rate` units/s of `tenant` through `node` for `seconds`; record admissions."""
    offered, carry = 0, 0.0
    last = start = time.monotonic_ns()
    while (now := time.monotonic_ns()) < start + int(seconds * NS):
        carry += rate * (now - last) / NS
        last = now
        while carry >= 1:
            carry -= 1
            offered += 1
            if node.try_admit(tenant, METRIC).allowed:
                out.append(Admission(time.monotonic_ns(), 1, node.member_id))
        await asyncio.sleep(0.002)
    return offered


def test_traffic_that_migrates_and_returns_after_an_idle_stays_in_the_envelope() -> None:
    """180 offers/s through a, then b, then a again, against R=50/s, B=10, b=2 on a key c
    owns. a idles for a phase, longer than `views_idle_ms` (1.5 s): it forgets its view, and
    its reports after the idle must still be applied, so the fleet stays within
    `R*t + B + N*b + R*d` over every interval, and the owner applies every unit admitted."""
    ids = ["a", "b", "c"]
    rate, burst, cap = 50, 10, 2
    phase_s, offered_rate, idle_ms = 3.5, 180.0, 1500
    tenant = _owned_by("c", ids, "mig")
    policy = {
        "tenant_id": tenant,
        "metric": METRIC,
        "generation": 1,
        "target_rate": rate,
        "global_burst": burst,
        "local_burst_cap": cap,
    }
    core = {"sync_interval_ms": SYNC_MS, "views_idle_ms": idle_ms}
    cfgs = static_nodes(ids, [policy], core=core)
    history: list[Admission] = []

    async def main() -> dict[str, Any]:
        async with Mesh(cfgs[0]) as a, Mesh(cfgs[1]) as b, Mesh(cfgs[2]) as c:
            await until(lambda: all(len(m.ring) == 3 for m in (a, b, c)), 5, "ring complete")
            assert a.ring.owner_of(RateKey(tenant, Metric.READ_IOPS, 1)) == "c"
            t0 = time.monotonic_ns()
            offered = 0
            for node in (a, b, a):
                offered += await _offer(node, tenant, offered_rate, phase_s, history)
            admitted = len(history)
            try:  # every admitted unit reaches the owner and is applied there
                await until(
                    lambda: c.health()["owner"]["applied_units"] >= admitted, 3, "owner applied"
                )
            except AssertionError:
                pass  # reported below, beside the envelope
            return {
                "t0": t0,
                "offered": offered,
                "d_ms": max(m.health()["d_ms"] for m in (a, b, c)),
                "owner": c.health()["owner"],
                "phases": _per_phase(history, t0, phase_s),
            }

    run = asyncio.run(main())
    d_s = 2 * SYNC_MS / 1000 + run["d_ms"] / 1000
    bound = len(ids) * cap + rate * d_s
    worst = worst_interval(history, rate)
    assert worst is not None
    said = (
        f"offered={run['offered']} admitted={len(history)} per phase={run['phases']} "
        f"d={d_s * 1000:.1f}ms allowed excess B+N*b+R*d={burst + bound:.1f}; worst: "
        f"{worst.explain(run['t0'])}; owner={run['owner']}"
    )
    over = violations(history, rate, burst + bound)
    assert over == 0, f"{over} interval ends past the envelope: {said}"
    assert run["owner"]["applied_units"] == len(history), said


def _per_phase(history: list[Admission], t0: int, phase_s: float) -> list[int]:
    out = [0, 0, 0]
    for a in history:
        out[min(2, int((a.t_ns - t0) / NS / phase_s))] += a.units
    return out

"""Graceful leave with etcd membership: the stopping member flushes its reports, leaves
the ring at once (long before its lease could lapse), and its keys move."""

from __future__ import annotations

import asyncio

import pytest

from bench._procs import free_port
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from mesh.core.verdict import Suspension
from mesh.node import Mesh
from ratemesh.envelope import excess_bound
from tests.mesh._etcd import EtcdServer
from tests.mesh._util import POLICY, until

pytestmark = pytest.mark.slow  # a real etcd and nodes

LEASE_TTL_S = 60  # so only an explicit leave can change the ring within the test


def test_graceful_leave_flushes_leaves_and_moves_keys(etcd: EtcdServer) -> None:
    ids = ["a", "b", "c"]
    ring = Ring(ids, 1)
    tenants = [f"t{i}" for i in range(200)]
    by_owner = {
        m: [t for t in tenants if ring.owner_of(RateKey(t, Metric.READ_IOPS, 1)) == m] for m in ids
    }
    leaver = "c"
    other = "a"  # an owner whose keys the leaver uses

    async def main() -> None:
        meshes = {
            m: Mesh(
                {
                    "member_id": m,
                    "listen": f"127.0.0.1:{free_port()}",
                    "shutdown_drain_ms": 1000,
                    "membership": {
                        "source": "etcd",
                        "endpoints": [etcd.url],
                        "prefix": "/leave/",
                        "lease_ttl_s": LEASE_TTL_S,
                    },
                    "policies": {"inline": [dict(POLICY, tenant_id="*")]},
                }
            )
            for m in ids
        }
        for mesh in meshes.values():
            await mesh.astart()
        await until(lambda: all(len(m.ring) == 3 for m in meshes.values()), 10, "joined")
        epoch = meshes["a"].ring.epoch
        # The leaver admits on keys `other` owns; part may still be unreported at stop.
        used = by_owner[other][:20]
        admitted = sum(meshes[leaver].try_admit(t, "read_iops").allowed for t in used)
        assert admitted > 0
        await meshes[leaver].aclose()
        owner = meshes[other]
        assert owner.health()["owner"]["applied_units"] >= admitted, "reports not flushed"
        survivors = [meshes[m] for m in ids if m != leaver]
        await until(
            lambda: all(m.ring.members == ("a", "b") for m in survivors),
            10,
            "the leaver's key is gone (a lapsed lease would take 60 s)",
        )
        assert len({m.ring.epoch for m in survivors}) == 1 and survivors[0].ring.epoch > epoch
        moved = by_owner[leaver][0]  # a key the leaver owned now has a new owner
        new_owner = survivors[0].ring.owner_of(RateKey(moved, Metric.READ_IOPS, 1))
        assert new_owner in ("a", "b")
        for m in survivors:
            m.try_admit(moved, "read_iops")
        target = meshes[new_owner]
        await until(lambda: target.health()["owner"]["keys"] > 0, 5, "the new owner meters it")
        for m in survivors:
            await m.aclose()

    asyncio.run(main())


def test_etcd_outage_keeps_the_ring_and_share_limits_disclose_it(etcd: EtcdServer) -> None:
    share = dict(POLICY, tenant_id="s", mode="share")

    async def main() -> None:
        cfg = {
            "member_id": "a",
            "listen": f"127.0.0.1:{free_port()}",
            "membership": {
                "source": "etcd",
                "endpoints": [etcd.url],
                "prefix": "/out/",
                "lease_ttl_s": 30,
                "poll_ms": 50,
            },
            "policies": {"inline": [share]},
        }
        async with Mesh(cfg) as mesh:
            await until(lambda: mesh.ring.members == ("a",) and mesh.ring.epoch > 0, 10, "joined")
            epoch = mesh.ring.epoch
            assert mesh.try_admit("s", "read_iops").suspended is None
            etcd.stop()
            await until(lambda: mesh.health()["membership"]["stale"], 10, "stale")
            v = mesh.try_admit("s", "read_iops")
            assert v.suspended is Suspension.MEMBERSHIP_STALE and v.bound.startswith(
                "membership_stale"
            )
            assert mesh.ring.epoch == epoch and mesh.ring.members == ("a",)
            etcd.start()
            await until(lambda: not mesh.health()["membership"]["stale"], 15, "fresh again")
            assert mesh.try_admit("s", "read_iops").suspended is None
            assert mesh.ring.epoch == epoch

    asyncio.run(main())


def test_graceful_leave_hands_keys_over_so_the_new_owner_continues(etcd: EtcdServer) -> None:
    """c drains most of a key it owns and leaves; the key's new owner continues from c's
    state (nearly exhausted stays nearly exhausted, full stays full) instead of restarting
    exhausted, and the fleet stays within B + R*t + N*b + R*d on the key."""
    ids = ["a", "b", "c"]
    R, B, b = 100, 100, 20  # 1 s from empty to full
    slow = dict(POLICY, tenant_id="*", target_rate=R, global_burst=B, local_burst_cap=b)
    ring, after = Ring(ids, 1), Ring(["a", "b"], 2)  # placement depends on members only
    owned_by_c = [
        t
        for t in (f"h{i}" for i in range(500))
        if ring.owner_of(RateKey(t, Metric.READ_IOPS, 1)) == "c"
    ]
    drained, full = owned_by_c[:2]
    key, full_key = (RateKey(t, Metric.READ_IOPS, 1) for t in (drained, full))
    new_owner = after.owner_of(key)
    user = "b" if new_owner == "a" else "a"  # a survivor that reports to the new owner

    async def main() -> None:
        loop = asyncio.get_running_loop()
        meshes = {
            m: Mesh(
                {
                    "member_id": m,
                    "listen": f"127.0.0.1:{free_port()}",
                    "shutdown_drain_ms": 1000,
                    "membership": {
                        "source": "etcd",
                        "endpoints": [etcd.url],
                        "prefix": "/handover/",
                        "lease_ttl_s": LEASE_TTL_S,
                    },
                    "policies": {"inline": [slow]},
                }
            )
            for m in ids
        }
        for mesh in meshes.values():
            await mesh.astart()
        await until(lambda: all(len(m.ring) == 3 for m in meshes.values()), 10, "joined")
        await asyncio.sleep(B / R + 0.1)  # c's keys now open full, not conservatively
        started = loop.time()
        admitted = int(meshes["c"].try_admit(full, "read_iops").allowed)
        used = 0
        while used < 70:  # c spends most of the burst of a key it owns itself
            assert loop.time() - started < 0.5, f"spent only {used}"
            if meshes["c"].try_admit(drained, "read_iops").allowed:
                used += 1
            else:
                await asyncio.sleep(0.001)
        admitted += used
        spent_at = loop.time()
        await meshes["c"].aclose()
        survivors = [meshes[m] for m in ("a", "b")]
        await until(
            lambda: all(m.ring.members == ("a", "b") for m in survivors), 10, "c left the ring"
        )
        target = meshes[new_owner]
        assert target.ring.owner_of(key) == new_owner
        assert target.health()["owner"]["handovers"]["pending"] >= 1, target.health()["owner"]
        views = meshes[user]._require().member.reporter.gates
        moved_at = loop.time()
        for t in (drained, full):
            admitted += meshes[user].try_admit(t, "read_iops").allowed
        await until(
            lambda: all(k in views and views[k].had_snapshot for k in (key, full_key)),
            5,
            "the new owner's first snapshots",
        )
        elapsed = loop.time() - spent_at
        got = views[key].snap_remaining
        # c left B - used (plus what refilled since); a conservative restart would show ~0.
        assert 15 <= got <= B - used + R * elapsed + 1, (got, used, elapsed)
        assert got < B - 3, (got, "the drained key must not come back full")
        assert views[full_key].snap_remaining >= B - 3, views[full_key].snap_remaining
        assert target.health()["owner"]["handovers"]["resumed"] >= 2
        # The survivors go on spending the key: the fleet stays within the envelope.
        while loop.time() - moved_at < 1.0:
            for m in survivors:
                admitted += m.try_admit(drained, "read_iops").allowed
            await asyncio.sleep(0.005)
        span_s = loop.time() - started
        d_ns = max(m.health()["d_ms"] for m in survivors) * 1e6
        bound = B + R * span_s + excess_bound(len(ids), b, R, d_ns)
        assert admitted <= bound, (admitted, bound)
        for m in survivors:
            await m.aclose()

    asyncio.run(main())

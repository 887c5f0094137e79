"""Verdicts on a real Mesh: the detailed form is counted as `try_admit` is, the
waiting forms answer `policy_unknown` at once, and after `stop()` every form answers the
same `stopped` verdict (no exception, no `rate_limited`), in both lifecycles."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from mesh.core.admission import STOPPED
from mesh.core.verdict import Reason, Step, Suspension, Verdict
from mesh.node import Mesh
from tests.mesh._util import wait_for

POLICY = {
    "tenant_id": "acme",
    "metric": "read_iops",
    "generation": 1,
    "mode": "local",
    "target_rate": 100,
    "global_burst": 10,
    "local_burst_cap": 10,
}


def _config(**limits: int) -> dict[str, Any]:
    p = {**POLICY, **limits}
    return {"member_id": "a", "policies": {"inline": [p]}, "shutdown_drain_ms": 200}


def _every_form(mesh: Mesh) -> list[Verdict]:
    """Every admission form, from a thread that is not the node's."""

    async def awaited() -> Verdict:
        return await mesh.admit("acme", "read_iops", timeout_s=5)

    return [
        mesh.try_admit("acme", "read_iops"),
        mesh.try_admit_detailed("acme", "read_iops"),
        mesh.charge("acme", "read_iops", 3),
        mesh.admit_blocking("acme", "read_iops", timeout_s=5),
        asyncio.run(awaited()),
    ]


def test_the_detailed_form_is_counted_under_its_shared_verdict() -> None:
    mesh = Mesh(_config(target_rate=1)).start()  # 1/s: no refill between the calls
    try:
        shared = mesh.try_admit("acme", "read_iops")
        detailed = mesh.try_admit_detailed("acme", "read_iops")
        assert detailed.allowed and detailed.shared() is shared and detailed is not shared
        assert (detailed.limit, detailed.step, detailed.retry_after_ms) == (1, Step.LOCAL, 0)
        assert detailed.remaining == 8
        assert json.loads(json.dumps(detailed.to_dict()))["remaining"] == 8
        assert mesh.decisions == {("acme", "read_iops", id(shared)): 2}
        waited = mesh.admit_blocking("acme", "read_iops", timeout_s=1)  # detailed too
        assert waited.allowed and waited.remaining == 7 and waited.retry_after_ms == 0
    finally:
        mesh.stop()


def test_waiting_forms_answer_policy_unknown_at_once() -> None:
    mesh = Mesh(_config()).start()
    try:
        t0 = time.monotonic()
        v = mesh.admit_blocking("nobody", "read_iops", timeout_s=5)

        async def awaited() -> Verdict:
            return await mesh.admit("nobody", "read_iops", timeout_s=5)

        w = asyncio.run(awaited())
        assert time.monotonic() - t0 < 1.0, "waiting cannot make a policy known"
        for x in (v, w):
            assert x.reason is Reason.POLICY_UNKNOWN, x
            assert x.suspended is Suspension.POLICY_UNKNOWN and x.retry_after_ms is None
        big = mesh.admit_blocking("acme", "read_iops", 11, timeout_s=5)
        assert big.reason is Reason.TOO_LARGE and time.monotonic() - t0 < 1.5
    finally:
        mesh.stop()


def test_after_stop_every_form_answers_stopped_the_same_way() -> None:
    mesh = Mesh(_config(target_rate=1, global_burst=1, local_burst_cap=1)).start()
    while mesh.try_admit("acme", "read_iops").allowed:
        pass
    parked: list[Verdict] = []
    t = threading.Thread(
        target=lambda: parked.append(mesh.admit_blocking("acme", "read_iops", timeout_s=30))
    )
    t.start()
    wait_for(lambda: len(mesh._require().member.admission.queues) == 1, 5, "the waiter parked")
    mesh.stop()
    t.join(5)
    assert parked == [STOPPED]
    assert _every_form(mesh) == [STOPPED] * 5
    assert all(v is STOPPED for v in _every_form(mesh))
    mesh.refund("acme", "read_iops", 1)  # a no-op after stop, not an error
    assert STOPPED.to_dict() == {
        "allowed": False,
        "reason": "stopped",
        "mode": None,
        "bound": "stopped:nothing_admitted",
        "suspended": None,
        "limit": None,
        "step": "stopped",
        "remaining": None,
        "retry_after_ms": None,
        "reset_after_ms": None,
    }


def test_after_aclose_every_form_answers_stopped_in_asyncio_mode() -> None:
    async def main() -> None:
        async with Mesh(_config(target_rate=1, global_burst=1, local_burst_cap=1)) as mesh:
            assert mesh.try_admit("acme", "read_iops").allowed
            waiter = asyncio.ensure_future(mesh.admit("acme", "read_iops", timeout_s=30))
            await asyncio.sleep(0.05)
            assert not waiter.done()
        assert await asyncio.wait_for(waiter, 2) is STOPPED
        assert mesh.try_admit("acme", "read_iops") is STOPPED
        assert mesh.try_admit_detailed("acme", "read_iops") is STOPPED
        assert mesh.charge("acme", "read_iops", 2) is STOPPED
        assert await mesh.admit("acme", "read_iops", timeout_s=1) is STOPPED
        assert (
            await asyncio.to_thread(mesh.admit_blocking, "acme", "read_iops", timeout_s=1)
            is STOPPED
        )
        mesh.refund("acme", "read_iops", 1)

    asyncio.run(main())

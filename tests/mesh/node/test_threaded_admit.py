"""`admit_blocking()`: the waiting admission for threaded apps, with real threads.

Many threads against one limit get at most the limit's worth, every wait ends by its
deadline, a full tenant queue answers at once, `stop()` releases parked threads with the
`stopped` verdict, and calling it on the node's own loop raises instead of deadlocking.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest

from mesh.core.admission import STOPPED
from mesh.core.verdict import Reason, Verdict
from mesh.errors import ConfigError
from mesh.node import Mesh
from tests.mesh._util import wait_for

RATE, BURST = 100, 20
SLACK_S = 0.4  # what a loaded 2-core CI adds to a deadline before the thread wakes


def _node(rate: int, burst: int, **core: Any) -> Mesh:
    policy = {
        "tenant_id": "acme",
        "metric": "read_iops",
        "generation": 1,
        "mode": "local",
        "target_rate": rate,
        "global_burst": burst,
        "local_burst_cap": burst,
    }
    return Mesh(
        {"member_id": "a", "policies": {"inline": [policy]}, "shutdown_drain_ms": 200, "core": core}
    ).start()


def _parked(mesh: Mesh) -> int:
    return len(mesh._require().member.admission.queues)


def _spend(mesh: Mesh) -> None:
    while mesh.try_admit("acme", "read_iops").allowed:
        pass


def test_many_threads_get_at_most_the_limit_and_waits_are_bounded() -> None:
    mesh = _node(RATE, BURST)
    verdicts: list[tuple[Verdict, float]] = []
    lock = threading.Lock()
    start = threading.Barrier(17)
    run_s, timeout_s = 1.0, 0.08

    def worker() -> None:
        start.wait()
        end = time.monotonic() + run_s
        while time.monotonic() < end:
            t0 = time.monotonic()
            v = mesh.admit_blocking("acme", "read_iops", timeout_s=timeout_s)
            with lock:
                verdicts.append((v, time.monotonic() - t0))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    try:
        for t in threads:
            t.start()
        start.wait()
        t0 = time.monotonic()
        for t in threads:
            t.join(run_s + timeout_s + 5)
        elapsed = time.monotonic() - t0
    finally:
        mesh.stop()
    reasons = Counter(v.reason for v, _ in verdicts)
    admitted = reasons[Reason.ADMITTED]
    assert set(reasons) <= {Reason.ADMITTED, Reason.DEADLINE_EXCEEDED}, reasons
    # The local limit: the burst, then R per second (plus at most one tick of refill).
    assert admitted <= BURST + RATE * (elapsed + 0.01) + 1, (admitted, elapsed)
    assert admitted >= BURST + RATE * run_s * 0.6, (admitted, elapsed)  # waiters are served
    assert reasons[Reason.DEADLINE_EXCEEDED] > 0, "16 threads queueing at 100/s must outlast 80 ms"
    assert max(d for _, d in verdicts) <= timeout_s + SLACK_S


def test_a_full_tenant_queue_answers_at_once() -> None:
    mesh = _node(1, 1, tenant_queue_max=4)
    results: list[tuple[Reason, float]] = []
    start = threading.Barrier(10)

    def worker() -> None:
        start.wait()
        t0 = time.monotonic()
        v = mesh.admit_blocking("acme", "read_iops", timeout_s=0.6)
        results.append((v.reason, time.monotonic() - t0))

    try:
        _spend(mesh)
        threads = [threading.Thread(target=worker) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
    finally:
        mesh.stop()
    full = [d for r, d in results if r is Reason.QUEUE_FULL]
    late = [d for r, d in results if r is Reason.DEADLINE_EXCEEDED]
    assert len(full) == 6 and len(late) == 4, results
    assert max(full) < 0.3 and all(0.5 <= d <= 0.6 + SLACK_S for d in late), results


def test_stop_releases_waiting_threads_with_the_stopped_verdict() -> None:
    mesh = _node(1, 1)
    _spend(mesh)
    answers: list[Verdict | BaseException] = []
    done_at: list[float] = []

    def worker() -> None:
        try:
            answers.append(mesh.admit_blocking("acme", "read_iops", timeout_s=30))
        except BaseException as exc:  # recorded for the assertions below
            answers.append(exc)
        done_at.append(time.monotonic())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: _parked(mesh) == 8, 5, "all eight threads parked")
    finally:
        stopped = time.monotonic()
        mesh.stop()
    for t in threads:
        t.join(5)
    assert answers == [STOPPED] * 8, answers
    assert max(done_at) - stopped < 2.0, "stop() must not wait for the waiters' deadlines"
    assert mesh.admit_blocking("acme", "read_iops", timeout_s=1) is STOPPED


def test_on_the_nodes_own_loop_it_raises_instead_of_deadlocking() -> None:
    mesh = _node(RATE, BURST)
    try:
        loop = mesh._loop
        assert loop is not None

        async def on_loop() -> str:
            try:
                mesh.admit_blocking("acme", "read_iops", timeout_s=1)
            except ConfigError as exc:
                return str(exc)
            return "no error"

        message = asyncio.run_coroutine_threadsafe(on_loop(), loop).result(5)
        assert "would deadlock" in message

        async def awaited_on_loop() -> Verdict:  # the awaitable form is the one to use there
            return await mesh.admit("acme", "read_iops", timeout_s=1)

        assert asyncio.run_coroutine_threadsafe(awaited_on_loop(), loop).result(5).allowed
    finally:
        mesh.stop()


def test_awaiting_admit_from_another_loop_in_threaded_mode() -> None:
    mesh = _node(RATE, BURST)

    async def main() -> Counter[Reason]:
        vs = await asyncio.gather(
            *(mesh.admit("acme", "read_iops", timeout_s=0.3) for _ in range(BURST + 10))
        )
        return Counter(v.reason for v in vs)

    try:
        reasons = asyncio.run(main())
    finally:
        mesh.stop()
    assert reasons[Reason.ADMITTED] >= BURST, reasons  # the burst, then refill while waiting
    assert sum(reasons.values()) == BURST + 10


def test_asyncio_mode_admit_blocking_from_a_worker_thread_and_release_on_close() -> None:
    async def main() -> None:
        async with Mesh(
            {
                "member_id": "a",
                "policies": {
                    "inline": [
                        {
                            "tenant_id": "acme",
                            "metric": "read_iops",
                            "generation": 1,
                            "mode": "local",
                            "target_rate": 1,
                            "global_burst": 1,
                            "local_burst_cap": 1,
                        }
                    ]
                },
            }
        ) as mesh:
            with pytest.raises(ConfigError, match="would deadlock"):
                mesh.admit_blocking("acme", "read_iops", timeout_s=1)
            v = await asyncio.to_thread(mesh.admit_blocking, "acme", "read_iops", timeout_s=1)
            assert v.allowed
            waiter = asyncio.ensure_future(mesh.admit("acme", "read_iops", timeout_s=30))
            await asyncio.sleep(0.05)
            assert not waiter.done()
        assert await asyncio.wait_for(waiter, 2) is STOPPED
        assert await mesh.admit("acme", "read_iops", timeout_s=1) is STOPPED

    asyncio.run(main())


def test_decisions_made_by_many_threads_are_all_counted() -> None:
    """The /metrics count of decisions is made under the same lock as the decision: no
    thread's increment overwrites another's (on a free-threaded build it would)."""
    mesh = _node(RATE, BURST)
    threads_n, calls = 8, 5000
    start = threading.Barrier(threads_n)

    def worker() -> None:
        start.wait()
        for _ in range(calls):
            mesh.try_admit("acme", "read_iops")

    try:
        threads = [threading.Thread(target=worker) for _ in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(mesh.decisions.values()) == threads_n * calls
    finally:
        mesh.stop()

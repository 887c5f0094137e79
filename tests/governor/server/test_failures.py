"""Failures end to end: a worker SIGKILLed while holding leases, governord SIGKILLed and
restarted under load, a governord that stops answering (the SDK fails closed)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from governor.client import Client, SessionLost
from tests.governor._daemon import KEYS, ROOT, Daemon, Raw, running
from tests.governor._stores import make_target

pytestmark = pytest.mark.slow  # every test runs governord and kills processes

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
A, B = KEYS["KEY_A"], KEYS["KEY_B"]
WORKER = Path(__file__).resolve().parents[1] / "_worker.py"


@pytest.fixture(params=KINDS)
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemon]:
    yield from running(request.param, tmp_path)


def test_sigkilled_worker_frees_the_pool_after_its_ttl(daemon: Daemon) -> None:
    ttl_ms = 1000
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), daemon.addr, A, str(ttl_ms), "4"],
        stdout=subprocess.PIPE,
        text=True,
        env=daemon.env() | {"PYTHONPATH": str(ROOT)},
    )
    raw = Raw(daemon.addr)
    try:
        assert worker.stdout is not None
        lines: list[str] = []
        while not lines or lines[-1] != "ready":
            line = worker.stdout.readline().strip()
            assert line, f"worker exited: {worker.wait()}"
            lines.append(line)
        token = next(x.split()[1] for x in lines if x.startswith("token"))
        leases = [int(x.split()[1]) for x in lines if x.startswith("lease")]
        assert len(leases) == 4
        tb = raw.session(B, ttl_ms=30_000)
        _, code, detail = raw("Acquire", {"node_id": 3, "cls": "db", "timeout_ms": 50}, token=tb)
        assert code is grpc.StatusCode.DEADLINE_EXCEEDED  # the pool is full
        scope_b = raw.ok("GetNode", {}, token=tb)["node_id"]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(raw, "Acquire", {"node_id": scope_b, "cls": "db"}, token=tb)
            time.sleep(0.1)
            killed = time.monotonic()
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            reply, code, detail = waiting.result(timeout=30)
            reclaim_s = time.monotonic() - killed
        assert code is grpc.StatusCode.OK, detail
        assert reply is not None and reply["lease_id"] > max(leases)  # a later fencing id
        assert reclaim_s <= ttl_ms / 1000 + 2.0, reclaim_s  # generous: CI machines are shared
        for lease in leases:  # every late release by the dead worker is refused
            _, code, detail = raw("Release", {"lease_id": lease}, token=token)
            assert code is grpc.StatusCode.FAILED_PRECONDITION, (code, detail)
            assert detail["end"] == "session_expired"
            assert raw.ok("Validate", {"lease_id": lease}, token=tb)["live"] is False
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        assert worker.stdout is not None
        worker.stdout.close()
        raw.close()


def test_governord_sigkilled_under_load_keeps_sessions_leases_and_acks(daemon: Daemon) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with Client(daemon.addr, A, ttl_ms=6000) as client:
            async with client.task("under-load", quotas={"http": 100_000}) as task:
                lease = await client.acquire_at(task.node_id, "db")
                acked = 0
                stop = asyncio.Event()

                async def load() -> None:
                    nonlocal acked
                    while not stop.is_set():
                        await client.consume_at(task.node_id, "http", 1)
                        acked += 1

                workers = [asyncio.create_task(load()) for _ in range(4)]
                for _ in range(2):  # two kills
                    target = acked + 50
                    while acked < target:
                        await asyncio.sleep(0.01)
                    await loop.run_in_executor(None, daemon.kill)
                    await loop.run_in_executor(None, daemon.start)
                target = acked + 50
                while acked < target:
                    await asyncio.sleep(0.01)
                stop.set()
                await asyncio.gather(*workers)
                assert client.lost is None
                assert await client.validate(lease.lease_id) is True
                info = await client.get_node(task.node_id)
                # resends carry the same request id: every acknowledged charge is on record,
                # and none is counted twice
                assert info["used"]["http"] == acked
                assert await client.release(lease) is True

    asyncio.run(scenario())
    assert daemon.starts == 3


def test_sdk_fails_closed_when_governord_stops_answering(tmp_path: Path) -> None:
    for store in make_target("sqlite", tmp_path):
        daemon = Daemon(tmp_path, store)
        daemon.start()
        try:

            async def scenario(daemon: Daemon = daemon) -> None:
                async with Client(daemon.addr, A, ttl_ms=600) as client:
                    reached_end = False
                    started = time.monotonic()
                    with pytest.raises(SessionLost):
                        async with client.task("work"):
                            daemon.signal(signal.SIGSTOP)
                            await asyncio.sleep(30)  # cancelled at the local deadline
                            reached_end = True
                    lost_after = time.monotonic() - started
                    daemon.signal(signal.SIGCONT)
                    assert not reached_end
                    assert client.lost is not None
                    assert lost_after < 5  # 80 % of 0.6 s, far from the 30 s sleep
                    with pytest.raises(SessionLost):
                        await client.consume("http")

            asyncio.run(scenario())
        finally:
            daemon.signal(signal.SIGCONT)
            daemon.close()


@pytest.mark.postgres
def test_failed_commit_stops_governord_with_status_70(tmp_path: Path) -> None:
    import psycopg

    from governor.store import EXIT_COMMIT_FAILED

    for store in make_target("postgres", tmp_path):
        daemon = Daemon(tmp_path, store)
        daemon.start()
        raw = Raw(daemon.addr)
        try:
            tok = raw.session(A)
            node = raw.ok("CreateNode", {"name": "n"}, token=tok)["node_id"]
            with psycopg.connect(store.target, autocommit=True) as conn:
                killed = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = %s",
                    (f"governord-{store.schema}",),
                ).fetchone()
            assert killed is not None and killed[0] == 1
            _, code, _ = raw("Consume", {"node_id": node, "resource": "http"}, token=tok)
            assert code is not grpc.StatusCode.OK  # never acknowledged
            assert daemon.proc is not None
            assert daemon.proc.wait(30) == EXIT_COMMIT_FAILED
            assert "commit failed" in daemon.stderr()
        finally:
            raw.close()
            daemon.close()

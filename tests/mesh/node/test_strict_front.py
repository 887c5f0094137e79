"""Strict limits on a real mesh node against a real governord (on SQLite and on
PostgreSQL): the node front-runs
governord with credit blocks. Admissions are recorded from outside and checked over every
interval against the governord node's `admitted <= R * (t1 - t0) + B`; governord is
SIGKILLed mid-run, after which nothing is admitted past the blocks' local expiry and every
verdict says `governor_unreachable`; after a restart admissions resume; leaving returns
every block."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.client import Client
from mesh.core.admission import STRICT_BOUND
from mesh.core.verdict import Reason, Suspension, Verdict
from mesh.node import Mesh
from ratemesh.envelope import excess_over_times
from tests.governor._daemon import KEYS, KINDS, Daemon
from tests.governor._stores import StoreTarget, make_target

pytestmark = pytest.mark.slow

RATE, BURST = 100, 40  # governord's rate on tenant a's node for read_iops
SESSION_TTL_MS = 3_000  # a block lives at most this long (ttl <= the session's TTL)
NS = 1_000_000_000
CLOCK_GRAIN_S = 0.001  # governord counts whole milliseconds (docs/strict.md, Assumptions)
BEFORE_KILL_S = 2.0
SETTLE_S = 1.0  # after the blocks' expiry: governord's absence is reported by then
AFTER_S = 1.0
WAIT_MAX_S = 20.0
PACE_S = 0.0005  # about 2,000 asks a second: far above R, so credit is the bottleneck


NOISY_RATE, NOISY_BURST = 20, 10  # a tenant the mesh turns away first


def _policy(tenant: str, rate: int, burst: int) -> dict[str, object]:
    return {
        "tenant_id": tenant,
        "metric": "read_iops",
        "generation": 1,
        "mode": "strict",
        "target_rate": rate,
        "global_burst": burst,
        "local_burst_cap": burst,
    }


Seen = tuple[int, Verdict]


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreTarget]:
    """governord's store: a SQLite file, or a fresh schema of the real PostgreSQL."""
    yield from make_target(request.param, tmp_path)


def _run(
    mesh: Mesh, seen: list[Seen], noisy: list[Seen], until: float, stop_when: object = None
) -> bool:
    """Ask for both tenants at a steady pace until `until` (monotonic s) or until
    `stop_when(acme's verdict)`."""
    while time.monotonic() < until:
        v = mesh.try_admit("acme", "read_iops")
        seen.append((time.monotonic_ns(), v))
        noisy.append((time.monotonic_ns(), mesh.try_admit("noisy", "read_iops")))
        if callable(stop_when) and stop_when(v):
            return True
        time.sleep(PACE_S)
    return False


async def _outstanding(addr: str) -> int:
    async with Client(addr, KEYS["KEY_A"]) as client:
        node = await client.get_node(client.scope_id)
    return int(node["credit"]["read_iops"]["outstanding"])


def test_strict_admissions_keep_the_envelope_through_a_governord_sigkill(
    tmp_path: Path, store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEY_A", KEYS["KEY_A"])
    daemon = Daemon(tmp_path, store)
    daemon.config["tenants"]["a"]["rates"] = {"read_iops": {"per_s": RATE, "burst": BURST}}
    daemon.start()
    mesh: Mesh | None = None
    try:
        mesh = Mesh(
            {
                "member_id": "w",
                # acme: the mesh's check is looser than governord's rate, so credit decides;
                # noisy spends at the same governord node, but the mesh turns it away first
                "policies": {
                    "inline": [
                        _policy("acme", 1_000, 200),
                        _policy("noisy", NOISY_RATE, NOISY_BURST),
                    ]
                },
                "shutdown_drain_ms": 200,
                "strict": {
                    "governord": daemon.addr,
                    "api_key_env": "KEY_A",
                    "session_ttl_ms": SESSION_TTL_MS,
                    "credit": {"horizon_ms": 200, "lead_ms": 100, "idle_ms": 300},
                },
            }
        ).start()
        seen: list[Seen] = []
        noisy: list[Seen] = []
        started_ns = time.monotonic_ns()
        # The first admit waits (bounded) for the first block: the waiting form.
        first = mesh.admit_blocking("acme", "read_iops", timeout_s=10.0)
        seen.append((time.monotonic_ns(), first))
        assert first.allowed and first.bound == STRICT_BOUND
        _run(mesh, seen, noisy, time.monotonic() + BEFORE_KILL_S)

        daemon.kill()
        killed_ns = time.monotonic_ns()
        expired_s = killed_ns / NS + SESSION_TTL_MS / 1000  # every block is past its life
        _run(mesh, seen, noisy, expired_s + SETTLE_S)
        calm_ns = int((expired_s + SETTLE_S) * NS) - int(0.2 * NS)

        daemon.start()
        restarted_ns = time.monotonic_ns()
        resumed = _run(
            mesh, seen, noisy, time.monotonic() + WAIT_MAX_S, stop_when=lambda v: v.allowed
        )
        assert resumed, "no admission within WAIT_MAX_S of governord's restart"
        _run(mesh, seen, noisy, time.monotonic() + AFTER_S)
        strict = mesh.health()["strict"]
        assert strict["governord"] == daemon.addr and strict["granted"] >= 2
        assert strict["unreachable"] >= 1 and strict["admitted"] >= BURST
        ended_ns = time.monotonic_ns()
        mesh.stop()
        mesh = None
        at_leave = outstanding = asyncio.run(_outstanding(daemon.addr))
        if outstanding:
            # Leaving gives every block back within bounded waits; one it could not (a
            # reserve granted as it left, a return slower than CLOSE_RETURNS_S on a loaded
            # machine) is counted until its ttl: by then none is left.
            time.sleep(SESSION_TTL_MS / 1000 + 0.5)
            outstanding = asyncio.run(_outstanding(daemon.addr))
        print(f"outstanding at leave {at_leave}, after the blocks' life {outstanding}")
    finally:
        if mesh is not None:
            mesh.stop()
        daemon.close()

    admitted = [(t, v) for t, v in seen if v.allowed]
    times = [t for t, _ in admitted]
    # Both tenants spend at one governord node: the envelope holds for them together.
    both = sorted(times + [t for t, v in noisy if v.allowed])
    excess = excess_over_times(both, [1] * len(both), RATE, BURST)
    noisy_in = sum(v.allowed for _, v in noisy)
    print(f"asked {len(seen)}, admitted {len(admitted)} + noisy {noisy_in}, excess {excess:.3f}")
    assert excess <= RATE * CLOCK_GRAIN_S, excess
    assert all(v.bound == STRICT_BOUND for _, v in seen)
    reasons = {v.reason for _, v in seen}
    # SNAPSHOT_STALE: the mesh front's view went stale (a loaded machine delays its owner's
    # snapshots past their TTL) and it vetoed, disclosed; the front passes that reason on.
    assert reasons <= {
        Reason.ADMITTED,
        Reason.NO_CREDIT,
        Reason.GLOBAL_LIMIT,
        Reason.GOVERNOR_UNREACHABLE,
        Reason.SNAPSHOT_STALE,
    }
    assert Reason.NO_CREDIT in reasons  # credit, not the mesh, was acme's bottleneck
    # noisy was turned away by the mesh first (its demand never reached governord), within
    # the mesh's own bound for one member, with d at most a second: N*b + R*(T + d).
    assert Reason.GLOBAL_LIMIT in {v.reason for _, v in noisy}
    run_s = (ended_ns - started_ns) / NS
    assert 0 < noisy_in <= NOISY_BURST + NOISY_RATE * (run_s + 1)
    # Nothing admitted past the blocks' life with governord down; by then every verdict
    # fails closed and says why.
    down = [
        (t, v) for t, v in seen + noisy if killed_ns + SESSION_TTL_MS * 1_000_000 <= t < calm_ns
    ]
    assert down and not any(v.allowed for _, v in down)
    calm = [v for t, v in seen if calm_ns - int(0.5 * NS) <= t < calm_ns]
    assert calm and all(
        v.reason is Reason.GOVERNOR_UNREACHABLE and v.suspended is Suspension.GOVERNOR_UNREACHABLE
        for v in calm
    ), {(v.reason, v.suspended) for v in calm}
    assert any(t > restarted_ns for t in times)  # resumed after the restart
    assert outstanding == 0  # every block given back, or expired with its ttl


def test_on_an_asyncio_node_admit_waits_for_credit_and_a_wrong_node_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`await mesh.admit()` waits for the first block; a tenant mapped to a node its key
    cannot reach (`strict.nodes`) is refused by governord: it never admits, its verdicts say
    `no_credit`, and /health counts the refusals."""
    monkeypatch.setenv("KEY_A", KEYS["KEY_A"])
    (store,) = list(make_target("sqlite", tmp_path))  # store-neutral: SQLite is enough
    daemon = Daemon(tmp_path, store)
    daemon.config["tenants"]["a"]["rates"] = {"read_iops": {"per_s": RATE, "burst": BURST}}
    daemon.start()

    async def run() -> tuple[Verdict, list[Verdict], Verdict, dict[str, int]]:
        config = {
            "member_id": "w",
            "policies": {"inline": [_policy("acme", 1_000, 200), _policy("stray", 1_000, 200)]},
            "shutdown_drain_ms": 200,
            "strict": {
                "governord": daemon.addr,
                "api_key_env": "KEY_A",
                "nodes": {"stray": 999_999},
            },
        }
        async with Mesh(config) as mesh:
            first = await mesh.admit("acme", "read_iops", timeout_s=10.0)
            stray = []
            for _ in range(20):
                stray.append(mesh.try_admit("stray", "read_iops"))
                await asyncio.sleep(0.05)
            waited = await mesh.admit("stray", "read_iops", timeout_s=0.2)
            health = mesh.health()
            (acme,) = [e for e in health["limits"] if e["tenant"] == "acme"]
            assert acme["bound"] == STRICT_BOUND and acme["credit_held"] >= 0
            return first, stray, waited, health["strict"]

    try:
        first, stray, waited, strict = asyncio.run(run())
    finally:
        daemon.close()
    assert first.allowed and first.bound == STRICT_BOUND
    assert not any(v.allowed for v in stray + [waited])
    assert {v.reason for v in stray} == {Reason.NO_CREDIT}
    assert waited.reason is Reason.DEADLINE_EXCEEDED and waited.suspended is None
    assert strict["refused"] >= 2 and strict["granted"] >= 1

"""After governord is SIGKILLed and restarted on the same SQLite store, a strict node's
admissions resume soon after the restarted governord is ready (its LISTENING line), within
the blocks' guarantee: the node notices governord is back by watching for it, not by the
back-off of a call that kept failing (docs/strict.md, "After a restart")."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from mesh.node import Mesh
from tests.governor._daemon import KEYS, Daemon
from tests.governor._stores import make_target

pytestmark = pytest.mark.slow

RATE, BURST = 2_000, 200
SESSION_TTL_MS = 10_000  # the session outlives the outage: governord keeps it
OUTAGE_S = 0.4
ROUNDS = 3
PACE_S = 0.0005
WAIT_MAX_S = 10.0
# The target is 100 ms from readiness to the first admission (docs/strict.md). The assertion
# allows a loaded 2-core machine (every process here shares it with parallel test runs) its
# scheduling delays: the median of the rounds within RESUME_BOUND_S. Before the watch it was
# 0.3-0.6 s, set by a failing call's back-off (doubling to 500 ms).
RESUME_BOUND_S = 0.25


def _strict_policy() -> dict[str, object]:
    """acme's strict read_iops, the mesh's step far above governord's rate: credit decides."""
    return {
        "tenant_id": "acme",
        "metric": "read_iops",
        "generation": 1,
        "mode": "strict",
        "target_rate": 20 * RATE,
        "global_burst": 20 * RATE,
        "local_burst_cap": 20 * RATE,
    }


def _first_admission_after(mesh: Mesh, since_ns: int) -> float:
    """Seconds from ``since_ns`` (monotonic) to the first strict admission."""
    until = time.monotonic() + WAIT_MAX_S
    while time.monotonic() < until:
        if mesh.try_admit("acme", "read_iops").allowed:
            return (time.monotonic_ns() - since_ns) / 1e9
        time.sleep(PACE_S)
    raise AssertionError(f"no admission within {WAIT_MAX_S} s of governord's restart")


def test_admissions_resume_soon_after_a_restarted_governord_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEY_A", KEYS["KEY_A"])
    store = next(make_target("sqlite", tmp_path))
    daemon = Daemon(tmp_path, store)
    daemon.config["tenants"]["a"]["rates"] = {"read_iops": {"per_s": RATE, "burst": BURST}}
    daemon.start()
    mesh: Mesh | None = None
    resumed: list[float] = []
    try:
        mesh = Mesh(
            {
                "member_id": "w",
                "policies": {"inline": [_strict_policy()]},
                "shutdown_drain_ms": 200,
                "strict": {
                    "governord": daemon.addr,
                    "api_key_env": "KEY_A",
                    "session_ttl_ms": SESSION_TTL_MS,
                },
            }
        ).start()
        assert mesh.admit_blocking("acme", "read_iops", timeout_s=10.0).allowed
        for _ in range(ROUNDS):
            _first_admission_after(mesh, time.monotonic_ns())  # serving before the kill
            daemon.kill()
            # spend out what is held, so the first admission after the restart needs a grant
            until = time.monotonic() + OUTAGE_S
            while time.monotonic() < until:
                mesh.try_admit("acme", "read_iops")
                time.sleep(PACE_S)
            daemon.start()
            resumed.append(_first_admission_after(mesh, time.monotonic_ns()))
        strict = mesh.health()["strict"]
    finally:
        if mesh is not None:
            mesh.stop()
        daemon.close()
    median = statistics.median(resumed)
    print(f"resumed after readiness: {[round(s * 1000) for s in resumed]} ms")
    print(f"load {os.getloadavg()}, strict {strict}")
    assert strict["revived"] >= ROUNDS - 1  # the watch saw governord back
    assert median <= RESUME_BOUND_S, resumed


IDLE_RATE_S = 5  # requests a second through the sidecar: each finds the holder all but idle
IDLE_REQUESTS = 10
IDLE_TIMEOUT_MS = 1_000


def test_through_the_sidecar_a_request_after_idle_waits_for_credit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 5 requests a second the holder asks for credit when a request comes (`begin`, not
    ahead): with `timeout_ms` each request waits for its block and is admitted; without,
    such a request is answered `no_credit` at once (counted and printed, not asserted: it
    depends on timing)."""
    import httpx

    monkeypatch.setenv("KEY_A", KEYS["KEY_A"])
    daemon = Daemon(tmp_path, next(make_target("sqlite", tmp_path)))
    daemon.config["tenants"]["a"]["rates"] = {"read_iops": {"per_s": 100, "burst": 20}}
    daemon.start()
    waited: list[bool] = []
    at_once: list[str] = []
    try:
        cfg = {
            "member_id": "w",
            "policies": {"inline": [_strict_policy()]},
            "sidecar": {"http_listen": "127.0.0.1:0"},
            "strict": {"governord": daemon.addr, "api_key_env": "KEY_A"},
        }
        mesh = Mesh(cfg).start()
        url = f"http://{mesh.sidecar_addresses['http']}/v1/admit"
        one = {"tenant": "acme", "metric": "read_iops"}
        try:
            with httpx.Client(timeout=10) as http:
                for i in range(2 * IDLE_REQUESTS):
                    body = {**one, "timeout_ms": IDLE_TIMEOUT_MS} if i % 2 == 0 else one
                    verdict = http.post(url, json=body).json()
                    if i % 2 == 0:
                        waited.append(verdict["allowed"])
                    else:
                        at_once.append(verdict["reason"])
                    time.sleep(1 / IDLE_RATE_S)
        finally:
            mesh.stop()
    finally:
        daemon.close()
    print(f"without timeout_ms: {at_once.count('no_credit')} of {len(at_once)} no_credit")
    assert waited == [True] * IDLE_REQUESTS

"""Two or three real `mesh node` processes sharing a fleet secret, each with an HTTP sidecar on
loopback, and the measuring the attack tests share: one unit per tenant offered every TICK_S
through a member's sidecar, counted by verdict, so a victim's admissions under attack are
compared with its own baseline from the same test."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import httpx

from bench._procs import free_port, spawn, write_config
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring

SECRET = b"security-suite-fleet-secret-0123456789"
TENANTS = [f"t{i}" for i in range(24)]
PHASE_S = 5.0  # each measured phase; counts, not rates, are compared
TICK_S = 0.02  # one admit batch per tick
WITHIN = 0.95  # the victim's admissions under attack, at least this share of its baseline


def policy(tenant: str) -> dict[str, Any]:
    # far above what the test offers: every admission is decided by the owner's news alone
    return {
        "tenant_id": tenant,
        "metric": "read_iops",
        "generation": 1,
        "mode": "global",
        "target_rate": 1_000_000,
        "global_burst": 1_000_000,
        "local_burst_cap": 100_000,
    }


def node_configs(tmp: Path, members: tuple[str, ...] = ("a", "b")) -> dict[str, dict[str, Any]]:
    """Members of one static ring sharing SECRET; each with an HTTP sidecar on loopback."""
    secret = tmp / "fleet-secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    ring = {m: f"127.0.0.1:{free_port()}" for m in members}
    return {
        m: {
            "member_id": m,
            "listen": ring[m],
            "telemetry_listen": "127.0.0.1:0",
            "shutdown_drain_ms": 200,
            "fleet_secret_file": str(secret),
            "membership": {"source": "static", "members": ring},
            "policies": {"inline": [policy(t) for t in TENANTS]},
            "sidecar": {"http_listen": "127.0.0.1:0"},
        }
        for m in ring
    }


async def admit_for(
    http: httpx.AsyncClient, url: str, tenants: list[str], seconds: float
) -> dict[str, int]:
    """Offer one unit per tenant every TICK_S for `seconds`; verdicts counted by reason."""
    items = [{"tenant": t, "metric": "read_iops", "amount": 1} for t in tenants]
    counts: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        resp = await http.post(f"{url}/v1/admit", json={"items": items}, timeout=10)
        assert resp.status_code == 200, resp.text
        for v in resp.json()["verdicts"]:
            counts[v["reason"]] = counts.get(v["reason"], 0) + 1
        await asyncio.sleep(TICK_S)
    return counts


def spawn_node(tmp: Path, cfg: dict[str, Any]) -> subprocess.Popen[str]:
    path = write_config(tmp / f"{cfg['member_id']}.json", cfg)
    return spawn(["-m", "mesh.cli", "node", "--config", str(path)])


def owned_by_a() -> list[str]:
    """The tenants a owns in the ring of a and b."""
    ring = Ring(["a", "b"], 1)
    owned = [t for t in TENANTS if ring.owner_of(RateKey(t, Metric.READ_IOPS, 1)) == "a"]
    assert len(owned) >= 4, owned
    return owned


async def warm(http: httpx.AsyncClient, url: str, tenants: list[str], timeout_s: float) -> None:
    """Until every item is admitted (b's stream to a carries reports, snapshots come back),
    or `timeout_s`: a victim that never gets there shows in the phase measured next."""
    end = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < end:
        got = await admit_for(http, url, tenants, 0.1)
        if got.get("admitted", 0) == sum(got.values()):
            return


def admitted_share(counts: dict[str, int]) -> float:
    return counts.get("admitted", 0) / max(1, sum(counts.values()))

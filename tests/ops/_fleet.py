"""A live fleet for the operations kit's tests: governord (SQLite, metrics and /ui on their
own port) and three `mesh node` processes (static membership, /metrics, /health and /ui on
`telemetry_listen`, the sidecar's HTTP admission API), under load from a thread that asks
every node for a global limit ("hot"), a strict one spending governord credit ("acme") and
a quiet one ("calm"). The static membership lists a fourth member, "d", that is down (being
replaced): the limit it owns ("ghost") is answered `suspended: owner_unreachable`, so the
pages have a suspension to show. A default policy ("*") serves one more tenant ("drifter"),
with no policy of its own. The other tenants' names are picked among owners a-c."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench._procs import free_port, read_ready, spawn, stop
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from tests.governor._daemon import KEYS, Daemon
from tests.governor._stores import StoreTarget

IDS = ["a", "b", "c"]
DOWN = "d"
RING = Ring([*IDS, DOWN], 1)


def _owned(*names: str, by_down: bool = False) -> str:
    """The first of `names` (then `names[0]` numbered) whose key the down member does (not)
    own."""
    for name in [*names, *(f"{names[0]}{i}" for i in range(2, 1000))]:
        if (RING.owner_of(RateKey(name, Metric.READ_IOPS, 1)) == DOWN) == by_down:
            return name
    raise AssertionError(f"no tenant name for {names[0]}")


HOT = {
    "tenant_id": _owned("hot", "noisy", "heavy", "loud"),
    "metric": "read_iops",
    "generation": 1,
    "mode": "global",
}
HOT.update(target_rate=500, global_burst=100, local_burst_cap=20)
CALM = dict(HOT, tenant_id=_owned("calm", "quiet", "steady"), target_rate=1000, global_burst=200)
GHOST = dict(
    HOT,
    tenant_id=_owned("ghost", "orphan", "stranded", by_down=True),
    target_rate=100,
    global_burst=20,
)
ACME = {
    "tenant_id": _owned("acme", "initech", "globex"),
    "metric": "read_iops",
    "generation": 1,
    "mode": "strict",
}
ACME.update(target_rate=1000, global_burst=200, local_burst_cap=200)
# every tenant without a policy of its own: DRIFTER is served under it (the page lists it)
DEFAULT = dict(HOT, tenant_id="*", target_rate=2000, global_burst=400, local_burst_cap=40)
DRIFTER = _owned("drifter", "wanderer", "nomad")
STRICT_RATE, STRICT_BURST = 50, 20  # governord's rate on tenant a's node for read_iops
BATCH = [{"tenant": HOT["tenant_id"], "metric": "read_iops"}] * 8 + [
    {"tenant": t, "metric": "read_iops"}
    for t in (ACME["tenant_id"], CALM["tenant_id"], GHOST["tenant_id"], DRIFTER)
]


@dataclass
class Fleet:
    governord: Daemon
    governord_http: str  # host:port of governord's /metrics and /ui
    telemetry: dict[str, str] = field(default_factory=dict)  # member -> host:port
    sidecar: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    asked: int = 0
    errors: list[str] = field(default_factory=list)

    def get(self, addr: str, path: str) -> httpx.Response:
        r = httpx.get(f"http://{addr}{path}", timeout=10)
        r.raise_for_status()
        return r

    def health(self, member: str) -> dict[str, Any]:
        out: dict[str, Any] = self.get(self.telemetry[member], "/health").json()
        return out


def _load(fleet: Fleet, done: threading.Event) -> None:
    """Ask every node in turn until `done`: several times the hot limit's rate."""
    with httpx.Client(timeout=10) as client:
        while not done.is_set():
            for m in IDS:
                try:
                    r = client.post(f"http://{fleet.sidecar[m]}/v1/admit", json={"items": BATCH})
                    r.raise_for_status()
                    fleet.asked += len(BATCH)
                except httpx.HTTPError as exc:  # reported by the test, not raised in a thread
                    fleet.errors.append(f"{m}: {exc}")
                    return
            done.wait(0.002)


@contextmanager
def running_fleet(tmp: Path) -> Iterator[Fleet]:
    gport = free_port()
    daemon = Daemon(tmp, StoreTarget("sqlite", str(tmp / "governor.db"), ""))
    daemon.config["metrics"] = f"127.0.0.1:{gport}"
    daemon.config["tenants"]["a"]["rates"] = {
        "read_iops": {"per_s": STRICT_RATE, "burst": STRICT_BURST}
    }
    fleet = Fleet(daemon, f"127.0.0.1:{gport}")
    done = threading.Event()
    loader = threading.Thread(target=_load, args=(fleet, done), daemon=True)
    try:
        daemon.start()
        members = {m: f"127.0.0.1:{free_port()}" for m in [*IDS, DOWN]}  # d: nothing there
        for m in IDS:
            cfg = {
                "member_id": m,
                "listen": members[m],
                "telemetry_listen": "127.0.0.1:0",
                "shutdown_drain_ms": 300,
                "membership": {"source": "static", "members": members},
                "policies": {"inline": [HOT, CALM, ACME, GHOST, DEFAULT]},
                "sidecar": {"http_listen": "127.0.0.1:0"},
                "strict": {
                    "governord": daemon.addr,
                    "api_key_env": "KEY_A",
                    "credit": {"horizon_ms": 200, "lead_ms": 100, "idle_ms": 300},
                },
            }
            path = tmp / f"node-{m}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            env = {"KEY_A": KEYS["KEY_A"]}
            fleet.procs[m] = spawn(["-m", "mesh.cli", "node", "--config", str(path)], env=env)
        for m, p in fleet.procs.items():
            ready = read_ready(p, timeout_s=30)
            fleet.telemetry[m], fleet.sidecar[m] = ready["telemetry"], ready["sidecar"]["http"]
        loader.start()
        yield fleet
    finally:
        done.set()
        if loader.is_alive():
            loader.join(10)
        for p in fleet.procs.values():
            stop(p)
        daemon.close()

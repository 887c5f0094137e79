"""The coordinator client rides out what the SDK rides out: a restart of its one governord,
an election whose standby does not know the leader yet, and a real takeover between two
governords on one PostgreSQL record, under `mesh policy apply` (both follow the leader with
the one `governor.client.leader.LeaderFollower`)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from bench._procs import free_port
from mesh.coordinator import PolicyStore
from mesh.errors import PeerUnavailable
from mesh.peer import CoordinatorClient
from mesh.testing.coordinator import CoordinatorServer
from tests.governor._daemon import ROOT, Daemon
from tests.governor._standby import Standby
from tests.governor._stores import make_target
from tests.mesh._util import POLICY

DOWN_S = 0.4  # how long the coordinator is away: several back-offs, well inside timeout_s


@contextlib.asynccontextmanager
async def _up_later(addrs: list[str]) -> AsyncIterator[tuple[CoordinatorClient, str]]:
    """A client of `addrs` and a coordinator that starts DOWN_S later on a free port (the
    last of the client's addresses); all of it stopped after."""
    addr = f"127.0.0.1:{free_port()}"
    later = CoordinatorServer(PolicyStore(), addr)
    client = CoordinatorClient([*addrs, addr], timeout_s=5.0)

    async def start() -> None:
        await asyncio.sleep(DOWN_S)
        await later.start()

    starting = asyncio.create_task(start())
    try:
        yield client, addr
    finally:
        await starting
        await client.close()
        await later.stop()


def test_a_put_rides_out_a_restart_of_its_one_address() -> None:
    async def main() -> None:
        async with _up_later([]) as (client, _):
            began = time.monotonic()
            assert (await client.put(POLICY)).generation == 1  # resent until it is back
            assert time.monotonic() - began >= DOWN_S * 0.9
            assert len((await client.list()).policies) == 1

    asyncio.run(main())


def test_a_put_waits_out_an_election_then_follows_the_new_leader() -> None:
    """The standby knows no leader yet (an election: hint ""), the other address is not up:
    the put backs off round the list until the leader answers, not once round and out."""

    async def main() -> None:
        standby = Standby("")
        await standby.start()
        try:
            async with _up_later([standby.addr]) as (client, addr):
                assert (await client.put(POLICY)).generation == 1
                assert client.addr == addr and standby.calls["Put"] >= 1
        finally:
            await standby.stop()

    asyncio.run(main())


def test_a_put_gives_up_at_its_timeout_naming_the_last_failure() -> None:
    async def main() -> None:
        client = CoordinatorClient(f"127.0.0.1:{free_port()}", timeout_s=0.3)
        try:
            began = time.monotonic()
            with pytest.raises(PeerUnavailable, match="coordinator.put: UNAVAILABLE"):
                await client.put(POLICY)
            assert 0.25 <= time.monotonic() - began < 2.0
        finally:
            await client.close()

    asyncio.run(main())


# ---- a real takeover under `mesh policy apply` ---------------------------------------------

KEY = "coordinator-key-of-the-deploy-bot"
HA = {"lease_ms": 600, "renew_ms": 100}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    """A leader and a standby on one PostgreSQL record, both serving the coordinator API."""
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    section = {"keys": {"deploy": {"api_key_sha256": sha, "scope": "coordinator"}}}
    for store in make_target("postgres", tmp_path):
        ds = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            ds.append(Daemon(tmp_path / name, store, ha=HA, coordinator=section))
        try:
            for d in ds:
                d.start()
            yield ds[0], ds[1]
        finally:
            for d in ds:
                d.close()


def _mesh_policy(addrs: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RATEMESH_API_KEY": KEY}
    return subprocess.run(
        [sys.executable, "-m", "mesh.cli", "policy", *argv, "--coordinator", addrs],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.mark.slow
@pytest.mark.postgres
def test_mesh_policy_apply_rides_out_a_takeover(
    pair: tuple[Daemon, Daemon], tmp_path: Path
) -> None:
    """The leader is SIGKILLed and `mesh policy apply` starts at once, naming both: the
    dead leader refuses connections and the standby answers not_leader naming it until its
    lease runs out; the command waits out the election and pushes through the new leader."""
    a, b = pair
    path = tmp_path / "policies.yaml"
    path.write_text(yaml.safe_dump({"policies": [POLICY]}))
    addrs = f"{a.addr},{b.addr}"
    a.kill()
    out = _mesh_policy(addrs, "apply", "-f", str(path), "--json", "--timeout", "15")
    assert out.returncode == 0, out.stderr
    assert [p["generation"] for p in json.loads(out.stdout)["added"]] == [1]
    listed = _mesh_policy(b.addr, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "acme" in listed.stdout

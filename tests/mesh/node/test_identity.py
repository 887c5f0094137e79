"""One identity per process (part 4): a second member with an id that a live
member holds refuses to start with one ConfigError naming member_id, while the first keeps
serving; a crashed incarnation's id is free again once its etcd lease lapses."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bench._procs import free_port, read_ready, spawn, stop
from mesh.errors import ConfigError
from mesh.membership import EtcdClient
from mesh.node import Mesh
from tests.mesh._etcd import EtcdServer
from tests.mesh._util import POLICY, run_mesh, static_nodes, until

pytestmark = pytest.mark.slow  # real etcd, real gRPC, processes

TTL_S = 2  # etcd's minimum lease TTL


def etcd_node(etcd: EtcdServer, member_id: str) -> dict[str, Any]:
    return {
        "member_id": member_id,
        "listen": "127.0.0.1:0",
        "shutdown_drain_ms": 200,
        "membership": {
            "source": "etcd",
            "endpoints": [etcd.url],
            "prefix": "/ident/members/",
            "lease_ttl_s": TTL_S,
            "poll_ms": 100,
        },
        "policies": {"inline": [POLICY]},
    }


def test_etcd_a_second_member_with_the_same_id_refuses_and_the_first_keeps_running(
    etcd: EtcdServer,
) -> None:
    async def main() -> None:
        async with Mesh(etcd_node(etcd, "a")) as first, Mesh(etcd_node(etcd, "b")) as b:
            await until(lambda: first.ring.members == ("a", "b"), 5, "ring of a and b")
            second = Mesh(etcd_node(etcd, "a"))
            with pytest.raises(ConfigError) as err:
                await second.astart()
            assert err.value.field == "member_id"
            assert "'a'" in str(err.value) and "\n" not in str(err.value)
            # The first still holds its key and serves; the ring never saw a second "a".
            client = EtcdClient((etcd.url,))
            try:
                _, kvs = await client.range_prefix("/ident/members/")
            finally:
                await client.close()
            assert sorted(kv.key for kv in kvs) == ["/ident/members/a", "/ident/members/b"]
            assert json.loads(kvs[0].value)["addr"] == first.address
            assert first.try_admit("acme", "read_iops").allowed
            assert first.health()["membership"]["members"] == ["a", "b"]
            assert b.ring.members == ("a", "b")

    asyncio.run(main())


def test_etcd_a_restart_takes_its_id_back_once_the_dead_lease_lapses(etcd: EtcdServer) -> None:
    async def main() -> None:
        client = EtcdClient((etcd.url,))
        try:  # a crashed incarnation: its key is held by a lease nobody renews
            dead = await client.grant(TTL_S)
            assert await client.claim("/ident/members/a", "{}", lease=dead) == 0
            async with Mesh(etcd_node(etcd, "a")) as again:
                _, kvs = await client.range_prefix("/ident/members/")
                assert [json.loads(kv.value)["addr"] for kv in kvs] == [again.address]
                assert kvs[0].lease != dead
        finally:
            await client.close()

    asyncio.run(main())


def test_static_a_second_member_with_the_same_id_on_another_port_refuses() -> None:
    async def main() -> None:
        cfg = static_nodes(["a", "b"])[0]
        async with Mesh(cfg) as first:
            with pytest.raises(ConfigError) as err:
                await Mesh(dict(cfg, listen=f"127.0.0.1:{free_port()}")).astart()
            assert err.value.field == "member_id"
            assert first.try_admit("acme", "read_iops").allowed

    asyncio.run(main())


def test_mesh_node_twice_with_the_same_id_on_etcd_the_second_exits_2_in_one_line(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(json.dumps(etcd_node(etcd, "solo")))
    first = spawn(["-m", "mesh.cli", "node", "--config", str(path)])
    try:
        assert read_ready(first)["member_id"] == "solo"
        out = run_mesh("node", "--config", str(path))
        assert out.returncode == 2, (out.returncode, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        lines = [ln for ln in out.stderr.splitlines() if not ln.startswith('{"ts":')]
        assert len(lines) == 1 and "member_id" in lines[0] and "'solo'" in lines[0], out.stderr
        assert first.poll() is None, "the first node must keep running"
    finally:
        stop(first)

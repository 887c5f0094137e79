"""governord as the mesh's policy coordinator, end to end: a real governord process (SQLite and
PostgreSQL), the mesh's own CoordinatorClient and PolicyFeed, real gRPC on loopback.

Generations continue across a SIGKILL; a worker's key reads but cannot write; a node's file is
either imported as the bootstrap or refused at the pusher (a watching node's declared
generations are reported, never a veto); a watching feed learns each new
generation, and falls back to polling while governord is down."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from mesh.coordinator import PolicyFeed
from mesh.core.policy import Metric, PolicyCache
from mesh.errors import PeerRefused, PeerUnavailable
from mesh.peer import CoordinatorClient
from ratemesh.coordinator import KEEPALIVE_MS, PolicySnapshot
from tests.governor._daemon import KINDS, ROOT, Daemon, wait_until
from tests.governor._stores import make_target

ADMIN_KEY = "coordinator-key-of-the-deploy-bot"
WORKER_KEY = "worker-key-of-the-mesh-nodes"
POLICY: dict[str, Any] = {
    "tenant_id": "acme",
    "metric": "read_iops",
    "target_rate": 100,
    "global_burst": 10,
    "local_burst_cap": 5,
}


def coordinator_section(policies_file: Path | None = None) -> dict[str, Any]:
    section: dict[str, Any] = {
        "keys": {
            "deploy": {"api_key_sha256": _sha(ADMIN_KEY), "scope": "coordinator"},
            "workers": {"api_key_sha256": _sha(WORKER_KEY), "scope": "worker"},
        }
    }
    if policies_file is not None:
        section["policies_file"] = str(policies_file)
    return section


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def started(kind: str, tmp_path: Path, **extra: Any) -> Iterator[Daemon]:
    for store in make_target(kind, tmp_path):
        extra.setdefault("coordinator", coordinator_section())
        d = Daemon(tmp_path, store, **extra)
        d.start()
        try:
            yield d
        finally:
            d.close()


running = contextmanager(started)


@pytest.fixture(params=KINDS)
def gov(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemon]:
    yield from started(request.param, tmp_path)


def client(d: Daemon, key: str | None = ADMIN_KEY, timeout_s: float = 10.0) -> CoordinatorClient:
    return CoordinatorClient(d.addr, api_key=key, timeout_s=timeout_s)


@pytest.mark.slow
def test_generations_continue_across_a_sigkill(gov: Daemon) -> None:
    async def put_two(first: int) -> None:
        c = client(gov)
        try:
            a = await c.put(dict(POLICY, target_rate=first))
            b = await c.put(dict(POLICY, target_rate=first + 1))
            same = await c.put(dict(POLICY, target_rate=first + 1))  # unchanged: no new one
            assert b.policy.generation == a.policy.generation + 1 and b.revision > a.revision
            assert not same.created and same.policy.generation == b.policy.generation
        finally:
            await c.close()

    asyncio.run(put_two(100))
    gov.kill()  # SIGKILL: whatever was acknowledged is in the record
    gov.start()
    asyncio.run(put_two(200))

    async def read() -> None:
        c = client(gov, WORKER_KEY)
        try:
            snap = await c.list()
            assert [p.generation for p in snap.policies] == [4]
            assert snap.policies[0].target_rate == 201 and snap.revision == 4
            history = await c.history("acme")
            assert [h.generation for h in history] == [1, 2, 3, 4]
            assert [h.policy.target_rate for h in history if h.policy] == [100, 101, 200, 201]
            assert await c.history("acme", Metric.WRITE_IOPS) == ()
        finally:
            await c.close()

    asyncio.run(read())


@pytest.mark.slow
def test_scopes_a_worker_key_reads_but_cannot_write(tmp_path: Path) -> None:
    with running("sqlite", tmp_path) as d:

        async def main() -> None:
            worker, anon, stranger = client(d, WORKER_KEY), client(d, None), client(d, "nope")
            try:
                with pytest.raises(PeerRefused, match="PERMISSION_DENIED.*scope worker"):
                    await worker.put(POLICY)
                with pytest.raises(PeerRefused, match="PERMISSION_DENIED"):
                    await worker.remove("acme", "read_iops")
                with pytest.raises(PeerRefused, match="UNAUTHENTICATED.*needs an API key"):
                    await anon.list()
                with pytest.raises(PeerRefused, match="UNAUTHENTICATED.*unknown"):
                    await stranger.list()
                assert (await worker.list()).revision == 0  # nothing was written
            finally:
                for c in (worker, anon, stranger):
                    await c.close()

        asyncio.run(main())


@pytest.mark.slow
def test_bootstrap_file_is_imported_once_and_a_conflicting_push_is_refused_at_the_pusher(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(yaml.safe_dump([dict(POLICY, generation=3)]))
    with running("sqlite", tmp_path, coordinator=coordinator_section(path)) as d:

        async def main() -> None:
            c = client(d)
            try:
                snap = await c.list()
                assert [(p.generation, p.target_rate) for p in snap.policies] == [(3, 100)]
                # the nodes' file pushed as it is: the same generation, the same values
                assert not (await c.put(dict(POLICY, generation=3))).created
                # a file that gives generation 3 other values: refused here, not at the nodes
                with pytest.raises(PeerRefused, match="FAILED_PRECONDITION.*generation 3"):
                    await c.put(dict(POLICY, generation=3, target_rate=7))
                with pytest.raises(PeerRefused, match="INVALID_ARGUMENT.*target_rate"):
                    await c.put(dict(POLICY, target_rate=-1))
                with pytest.raises(PeerRefused, match="FAILED_PRECONDITION.*not 0"):
                    await c.put(dict(POLICY, target_rate=7), expect_generation=0)
                assert (await c.put(dict(POLICY, target_rate=7))).policy.generation == 4
                assert (await c.list()).revision == 2
            finally:
                await c.close()

        asyncio.run(main())
        # restarted with a file that now says something else: governord's record wins
        path.write_text(yaml.safe_dump([dict(POLICY, generation=3, target_rate=1)]))
        d.stop()
        d.start()

        async def after() -> None:
            c = client(d, WORKER_KEY)
            try:
                snap = await c.list()
                assert [(p.generation, p.target_rate) for p in snap.policies] == [(4, 7)]
            finally:
                await c.close()

        asyncio.run(after())
        assert "differs from governord's record" in d.stderr()


@pytest.mark.slow
def test_a_watching_feed_learns_each_generation_and_polls_while_governord_is_down(
    tmp_path: Path,
) -> None:
    with running("sqlite", tmp_path) as d:

        async def main() -> None:
            admin = client(d)
            watcher = client(d, WORKER_KEY, timeout_s=1.0)
            cache = PolicyCache()
            feed = PolicyFeed(watcher, cache, poll_ttl_s=0.1)
            task = asyncio.create_task(feed.run())
            try:
                await admin.put(POLICY)
                await _until(lambda: _gen(cache) == 1, "generation 1 by watch")
                assert feed.watching
                await admin.put(dict(POLICY, target_rate=500))
                await _until(lambda: _gen(cache) == 2, "generation 2 by watch")
                await admin.remove("acme", "read_iops")
                await _until(lambda: _gen(cache) == 0, "the removal")
                d.kill()
                await _until(lambda: not feed.watching, "the watch noticed")
                with pytest.raises(PeerUnavailable):
                    await watcher.list()
                d.start()
                await _retried(lambda: admin.put(dict(POLICY, target_rate=900)))
                await _until(lambda: _gen(cache) == 4, "generation 4 after the restart")
                assert cache.current("acme", Metric.READ_IOPS).target_rate == 900  # type: ignore[union-attr]
                assert feed.conflicts == 0
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await admin.close()
                await watcher.close()

        asyncio.run(main())


async def _retried(call: Any, timeout_s: float = 10.0) -> Any:
    """A call while the channel's reconnect backoff (at most 1 s) runs out after a restart."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while True:
        try:
            return await call()
        except PeerUnavailable:
            if loop.time() > end:
                raise
            await asyncio.sleep(0.1)


def _gen(cache: PolicyCache) -> int:
    p = cache.current("acme", Metric.READ_IOPS)
    return 0 if p is None else p.generation


async def _until(pred: Any, what: str, timeout_s: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not pred():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.slow
def test_an_idle_watch_outlives_more_than_two_client_pings(tmp_path: Path) -> None:
    """The node's channel pings every KEEPALIVE_MS; governord accepts that, so a watch with
    nothing to say stays the same stream (gRPC's default server answered the third ping with
    GOAWAY `too_many_pings`, and the feed fell back to polling)."""
    idle_s = 2.5 * KEEPALIVE_MS / 1000
    with running("sqlite", tmp_path) as d:

        async def main() -> None:
            admin, watcher = client(d), client(d, WORKER_KEY)
            stream = cast(AsyncGenerator[PolicySnapshot, None], watcher.watch(0))
            try:
                await admin.put(POLICY)
                first = await asyncio.wait_for(anext(stream), 10)
                assert first.revision == 1
                await asyncio.sleep(idle_s)
                await admin.put(dict(POLICY, target_rate=5))
                second = await asyncio.wait_for(anext(stream), 10)  # the same stream
                assert second.revision == 2 and second.policies[0].generation == 2
            finally:
                await stream.aclose()
                await admin.close()
                await watcher.close()

        asyncio.run(main())
        assert "too_many_pings" not in d.stderr()


# ---- the `mesh policy` command against governord --------------------------------------------


def mesh_policy(d: Daemon, *argv: str, key: str = ADMIN_KEY) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RATEMESH_API_KEY": key}
    return subprocess.run(
        [sys.executable, "-m", "mesh.cli", "policy", *argv, "--coordinator", d.addr],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def apply_json(d: Daemon, path: Path, *extra: str) -> dict[str, Any]:
    out = mesh_policy(d, "apply", "-f", str(path), "--json", *extra)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


@pytest.mark.slow
def test_mesh_policy_apply_diffs_pushes_and_continues_after_a_sigkill(gov: Daemon) -> None:
    path = gov.tmp / "policies.yaml"
    beta = dict(POLICY, tenant_id="beta", metric="write_iops")
    path.write_text(yaml.safe_dump({"policies": [POLICY, beta]}))
    dry = apply_json(gov, path, "--dry-run")
    assert [(c["tenant_id"], c["generation"]) for c in dry["added"]] == [("acme", 1), ("beta", 1)]
    assert dry["dry_run"] and mesh_policy(gov, "list", "--json").stdout.count("acme") == 0

    first = apply_json(gov, path)
    assert len(first["added"]) == 2 and first["unchanged"] == 0
    assert apply_json(gov, path)["unchanged"] == 2  # a re-apply adds nothing

    gov.kill()
    gov.start()
    path.write_text(yaml.safe_dump([dict(POLICY, target_rate=300)]))  # beta left out
    human = mesh_policy(gov, "apply", "-f", str(path), "--dry-run")
    assert human.returncode == 0, human.stderr
    assert "~ acme/read_iops  generation 1 -> 2: target_rate 100 -> 300" in human.stdout
    assert "beta/write_iops  not in the file: kept" in human.stdout
    pruned = apply_json(gov, path, "--prune")
    assert [(c["generation"], c["changes"]) for c in pruned["changed"]] == [
        (2, {"target_rate": [100, 300]})
    ]
    assert [(c["tenant_id"], c["generation"]) for c in pruned["removed"]] == [("beta", 2)]

    back = mesh_policy(gov, "rollback", "acme", "read_iops", "--to", "1", "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["generation"] == 3

    listed = json.loads(mesh_policy(gov, "list", "--json").stdout)
    assert [(p["tenant_id"], p["generation"], p["target_rate"]) for p in listed["policies"]] == [
        ("acme", 3, 100)
    ]
    assert listed["removed"] == [{"tenant_id": "beta", "metric": "write_iops", "generation": 2}]
    hist = mesh_policy(gov, "history", "acme", "--metric", "read_iops")
    assert hist.returncode == 0 and hist.stdout.count("acme/read_iops  generation") == 3


@pytest.mark.slow
def test_mesh_policy_errors_are_one_line(tmp_path: Path) -> None:
    with running("sqlite", tmp_path) as d:
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump([dict(POLICY, generation=2)]))
        worker = mesh_policy(d, "apply", "-f", str(path), key=WORKER_KEY)
        assert worker.returncode == 1 and "PERMISSION_DENIED" in worker.stderr
        assert len(worker.stderr.strip().splitlines()) == 1
        assert apply_json(d, path)["added"][0]["generation"] == 2  # the file's number, adopted
        path.write_text(yaml.safe_dump([dict(POLICY, generation=2, target_rate=1)]))
        conflict = mesh_policy(d, "apply", "-f", str(path))
        assert conflict.returncode == 2, conflict.stderr
        assert "generation 2 is governord's current with other values" in conflict.stderr
        path.write_text(yaml.safe_dump([dict(POLICY, target_rate="fast")]))
        bad = mesh_policy(d, "apply", "-f", str(path))
        assert bad.returncode == 2 and "[0].target_rate" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
        missing = mesh_policy(d, "rollback", "acme", "read_iops", "--to", "9")
        assert missing.returncode == 2 and "no kept generation 9" in missing.stderr


@pytest.mark.slow
def test_a_mesh_node_admits_under_governords_generations(tmp_path: Path) -> None:
    """A real `Mesh` node configured with governord as its coordinator and a worker key file:
    unknown until governord has a policy, then each put's generation by watch."""
    from mesh.core.verdict import Reason
    from mesh.node import Mesh

    (tmp_path / "worker.key").write_text(WORKER_KEY + "\n")
    with running("sqlite", tmp_path) as d:

        async def main() -> None:
            admin = client(d)
            coord = {"addr": d.addr, "api_key_file": str(tmp_path / "worker.key")}
            cfg = {"member_id": "a", "policies": {"coordinator": {**coord, "poll_ttl_ms": 100}}}
            try:
                async with Mesh(cfg) as node:
                    assert node.try_admit("acme", "read_iops").reason is Reason.POLICY_UNKNOWN
                    await admin.put(POLICY)
                    await _until(lambda: node.try_admit("acme", "read_iops").allowed, "gen 1")
                    await admin.put(dict(POLICY, target_rate=500))
                    await _until(lambda: _limit_gen(node) == 2, "gen 2 on the node")
                    coordinator = node.health()["policies"]["coordinator"]
                    assert coordinator["watching"] and coordinator["conflicts"] == 0
            finally:
                await admin.close()

        asyncio.run(main())


def _conflicts(node: Any) -> int:
    return int(node.health()["policies"]["coordinator"]["conflicts"])


def _limit_gen(node: Any) -> int:
    return max((x["generation"] for x in node.health()["limits"]), default=0)


@pytest.mark.slow
def test_malformed_requests_are_refused_naming_the_field_and_change_nothing(
    tmp_path: Path,
) -> None:
    import grpc

    from governor import wire
    from ratemesh import coordinator as cw

    with running("sqlite", tmp_path) as d:
        channel = grpc.insecure_channel(d.addr)
        md = ((cw.API_KEY_MD, ADMIN_KEY),)

        def call(method: str, body: bytes | dict[str, Any]) -> tuple[grpc.StatusCode, str]:
            data = body if isinstance(body, bytes) else cw.pack(body)
            try:
                channel.unary_unary(cw.method_path(method))(data, metadata=md, timeout=10)
            except grpc.RpcError as exc:
                detail = dict(exc.trailing_metadata() or ()).get(wire.ERROR_MD)
                return exc.code(), str(wire.unpack(detail).get("field")) if detail else ""
            return grpc.StatusCode.OK, ""

        bad: list[tuple[str, bytes | dict[str, Any], str]] = [
            ("Put", b"\xc1", "put"),
            ("Put", {"policy": 5}, "policy"),
            ("Put", {"policy": dict(POLICY, metric="Read-Ops")}, "policy.metric"),
            ("Put", {"policy": dict(POLICY, target_rate="100/fortnight")}, "policy.target_rate"),
            ("Put", {"policy": dict(POLICY, unit="furlongs")}, "policy.unit"),
            ("Put", {"policy": POLICY, "expect_generation": -1}, "expect_generation"),
            ("Put", {"policy": POLICY, "extra": 1}, "put.extra"),
            ("Remove", {"tenant_id": "acme", "metric": 3}, "metric"),
            (
                "Remove",
                {"tenant_id": "acme", "metric": "read_iops", "descriptor": {"a": "1", "b": "2"}},
                "descriptor",
            ),
            ("History", {"tenant_id": ""}, "tenant_id"),
        ]
        try:
            for method, body, field in bad:
                code, got = call(method, body)
                assert (code, got) == (grpc.StatusCode.INVALID_ARGUMENT, field), (method, body)
            code, _ = call("Remove", {"tenant_id": "acme", "metric": "read_iops"})
            assert code is grpc.StatusCode.NOT_FOUND
            reply = channel.unary_unary(cw.method_path("List"))(cw.pack({}), metadata=md)
            assert cw.unpack(reply, "list")["revision"] == 0  # nothing was written
        finally:
            channel.close()


@pytest.mark.slow
def test_a_push_that_a_watching_nodes_file_would_refuse_is_reported_not_refused(
    tmp_path: Path,
) -> None:
    """The issue's first push: nodes load generation 1 from their file, governord did not
    import it. A watch's declarations are no precondition on writers (the worker key must not
    veto a push): giving generation 1 other values lands, governord names the node that
    refuses it, and the next generation reaches the node."""
    from mesh.node import Mesh

    (tmp_path / "worker.key").write_text(WORKER_KEY + "\n")
    with running("sqlite", tmp_path) as d:

        async def main() -> None:
            admin = client(d)
            coord = {"addr": d.addr, "api_key_file": str(tmp_path / "worker.key")}
            policies = {"inline": [dict(POLICY, generation=1)], "coordinator": coord}
            try:
                async with Mesh({"member_id": "node-a", "policies": policies}) as node:
                    await _until(lambda: node.health()["policies"]["coordinator"]["watching"], "w")
                    first = await admin.put(dict(POLICY, target_rate=500))
                    assert first.policy.generation == 1
                    # the pusher hears it in the reply (`mesh policy apply` prints it)
                    assert [line.split(" loads ")[0] for line in first.disagreements] == [
                        "node node-a"
                    ], first
                    await _until(
                        lambda: node.health()["policies"]["coordinator"]["conflicts"] > 0, "c"
                    )
                    done = await admin.put(dict(POLICY, generation=2, target_rate=501))
                    assert done.policy.generation == 2
                    await _until(lambda: _limit_gen(node) == 2, "gen 2 on the node")
                # the node is gone: its file no longer pins anything
                assert (await admin.put(dict(POLICY, target_rate=7))).policy.generation == 3
                policies["inline"] = [dict(POLICY, generation=3, target_rate=8)]
                async with Mesh({"member_id": "node-b", "policies": policies}) as node:
                    await _until(
                        lambda: node.health()["policies"]["coordinator"]["conflicts"] > 0, "c"
                    )
                    # governord hears what it loads with its watch (a poll may come first)
                    await _until(lambda: node.health()["policies"]["coordinator"]["watching"], "w")
            finally:
                await admin.close()

        asyncio.run(main())
        # governord names both nodes on stderr; the log lines may trail the answers
        for line in (
            "node node-a loads acme/read_iops generation 1",
            "node node-b loads acme/read_iops generation 3",
        ):
            assert wait_until(lambda line=line: line in d.stderr(), 10), d.stderr()


@pytest.mark.slow
def test_governord_stores_and_returns_a_unit_a_string_rate_and_a_descriptor(
    tmp_path: Path,
) -> None:
    """Through a real governord: the coordinator API takes the new fields, stores them
    as events, and returns them (also after a SIGKILL); a unit conflict is refused naming both."""
    tokens = {
        "tenant_id": "acme",
        "metric": "tokens",
        "unit": "tokens",
        "target_rate": "60k/minute",
        "global_burst": "8k",
        "local_burst_cap": "1k",
        "descriptor": {"route": "/v1/chat"},
    }
    with running("sqlite", tmp_path) as d:

        async def put() -> None:
            c = client(d)
            try:
                got = (await c.put(tokens)).policy
                assert (got.target_rate, got.global_burst, got.unit.value) == (1000, 8000, "tokens")
                assert got.to_dict()["descriptor"] == {"route": "/v1/chat"}
                await c.put(dict(POLICY, metric="requests", target_rate="100/second"))
                with pytest.raises(PeerRefused, match="a metric has one unit"):
                    await c.put(dict(tokens, tenant_id="beta", unit="usd_micros"))
            finally:
                await c.close()

        async def read() -> None:
            c = client(d, WORKER_KEY)
            try:
                snap = await c.list()
                by_metric = {p.metric: p.to_dict() for p in snap.policies}
                assert by_metric["tokens"] == {
                    **tokens,
                    "generation": 1,
                    "target_rate": 1000,
                    "global_burst": 8000,
                    "local_burst_cap": 1000,
                    "enabled": True,
                    "mode": "global",
                }
                assert by_metric["requests"]["target_rate"] == 100
                assert "unit" not in by_metric["requests"]  # the name's default, as before
                history = await c.history("acme", "tokens")
                assert [h.generation for h in history] == [1]
            finally:
                await c.close()

        asyncio.run(put())
        asyncio.run(read())
        d.kill()
        d.start()
        asyncio.run(read())

        async def second() -> None:  # a new generation of the descriptor's key, and acme's own
            c = client(d)
            try:
                assert (await c.put(dict(tokens, target_rate=2000))).policy.generation == 2
                plain = {k: v for k, v in tokens.items() if k != "descriptor"}
                assert (await c.put(plain)).policy.generation == 1  # another key
            finally:
                await c.close()

        asyncio.run(second())
        back = mesh_policy(
            d, "rollback", "acme", "tokens", "--descriptor", "route=/v1/chat", "--to", "1", "--json"
        )
        assert back.returncode == 0, back.stderr
        out = json.loads(back.stdout)
        assert (out["generation"], out["from_generation"]) == (3, 2), out
        assert out["changes"] == {"target_rate": [2000, 1000]}
        assert (out["tenant_id"], out["descriptor"]) == ("acme", {"route": "/v1/chat"})
        assert "acme[route=/v1/chat]/tokens" in mesh_policy(d, "list").stdout

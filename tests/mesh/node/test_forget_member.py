"""Decommissioning a replica by name, end to end: two real nodes (real gRPC) with the spend
quotas' cell tier on the real Redis or PostgreSQL (under CI=true a missing one fails),
a replaced replica's burn left in the owner's fold and in the tier, and
`mesh fleet forget-member` purging both, so that burn stops counting twice."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from bench._procs import free_port
from mesh.cli import main
from mesh.core.messages import Cell, CellPublish
from mesh.core.policy import RateKey
from mesh.core.quota import CellTier
from mesh.node import Mesh
from mesh.sharedstate import RedisCellTier
from tests.mesh._redis import connect
from tests.mesh.sharedstate._postgres import DSN_ENV, pg_schema

pytestmark = pytest.mark.slow  # nodes on real sockets

QUOTA = {
    "tenant_id": "acme",
    "metric": "tokens_used",
    "unit": "tokens",
    "generation": 1,
    "period": "month",
    "quota": 1000,
}
KEY = RateKey("acme", "tokens_used", 1)
OLD_BURN = 25  # what the replaced replica ("old") spent before it went


@contextmanager
def _tier_config(kind: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The node config's shared_state for `kind` ({} for Redis: its tier is set per node)."""
    if kind == "postgres":
        with pg_schema() as (dsn, schema):
            monkeypatch.setenv(DSN_ENV, dsn)
            yield {"postgres": {"external": "allow", "dsn_env": DSN_ENV, "schema": schema}}
        return
    yield {}


def _wait(pred: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_forget_member_stops_a_replaced_replicas_burn_counting_twice(
    kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    addr = {m: f"127.0.0.1:{free_port()}" for m in ("a", "b")}
    prefix = f"test:cells:{uuid.uuid4().hex}:"
    with ExitStack() as stack:
        shared = stack.enter_context(_tier_config(kind, monkeypatch))
        meshes = {
            m: Mesh(
                {
                    "member_id": m,
                    "listen": addr[m],
                    "shutdown_drain_ms": 200,
                    "core": {"quota_publish_ms": 50},
                    "membership": {"source": "static", "members": addr},
                    "policies": {"inline": [QUOTA]},
                    **({"shared_state": shared} if shared else {}),
                }
            ).start()
            for m in addr
        }
        for mesh in meshes.values():
            stack.callback(mesh.stop)
        client = None
        if kind == "redis":
            client = connect()
            stack.callback(client.close)
            for mesh in meshes.values():
                mesh._require().cell_tier = RedisCellTier(client, prefix=prefix)

            def clean() -> None:
                for k in client.scan_iter(match=prefix + "*"):
                    client.delete(k)

            stack.callback(clean)
        a, b = meshes["a"], meshes["b"]
        if kind == "postgres":  # /health names the tier, never its DSN
            cap = a.health()["capability"]
            tier_row = next(t for t in cap["tiers"] if t["tier"] == "postgres")
            assert tier_row["serves"] == ["spend quota cells"] and cap["shared_state_enabled"]
            assert "dsn" not in json.dumps(cap).lower()
        assert sum(a.try_admit("acme", "tokens_used", 1).allowed for _ in range(30)) == 30
        assert sum(b.try_admit("acme", "tokens_used", 1).allowed for _ in range(20)) == 20

        def remote(mesh: Mesh) -> int:
            rows = mesh.health()["quotas"]["quotas"]
            return int(rows[0]["remote"]) if rows else -1

        _wait(lambda: remote(a) == 20 and remote(b) == 30, "both folds")
        index = a.health()["quotas"]["quotas"][0]["period_index"]

        # The replica "b" replaced: its cell is still in the owner's fold and in the tier.
        def folds(mesh: Mesh) -> Any:
            quotas = mesh._require().member.quotas
            assert quotas is not None
            return quotas.folds

        owner = next(m for m in meshes.values() if folds(m).fold(KEY, index)[0] > 0)
        lock = owner._lock
        assert lock is not None  # a threaded Mesh
        with lock:
            folds(owner).publish(
                int(time.time() * 1000), "old", CellPublish("old", 0, (Cell(KEY, index, OLD_BURN),))
            )
        tier: CellTier | None = a._require().cell_tier
        assert tier is not None
        tier.exchange(0, KEY, index, "old", OLD_BURN)
        _wait(lambda: (remote(a), remote(b)) == (20 + OLD_BURN, 30 + OLD_BURN), "old counted")
        b.try_admit("acme", "tokens_used", 1)  # a publish, so the tier fold is re-read too
        _wait(lambda: remote(a) == 20 + 1 + OLD_BURN, "still counted twice")

        capsys.readouterr()
        assert main(["fleet", "forget-member", "b", "--addr", addr["a"]]) == 1  # in the ring
        assert "is in the ring" in capsys.readouterr().err
        assert main(["fleet", "forget-member", "old", "--addr", addr["a"]]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["forgot"] == "old" and report["failed"] == 0
        assert report["folds_cells"] == 1  # the owner's fold held it
        assert report["tier_cells"] == 1  # the tier held it, purged once
        assert {r["member_id"] for r in report["members"]} == {"a", "b"}

        # After: each node's remote is its live peer's burn alone.
        _wait(lambda: (remote(a), remote(b)) == (21, 30), "old forgotten")
        assert tier.exchange(0, KEY, index, "a", 30).keys() == {"a", "b"}

"""`mesh policy preview` against a running fleet over real gRPC, proved with the fleet
secret: while two members take traffic, a tighter limit's preview says what it would deny,
per tenant, from the members' meters; an unchanged tenant gets no row; the command's
mistakes are one line and exit 2, a silent fleet one line and exit 1."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from mesh.cli import main as mesh_main
from mesh.coordinator import PolicyStore
from mesh.node import Mesh
from mesh.peer import CoordinatorClient
from mesh.testing.coordinator import CoordinatorServer
from tests.mesh._util import POLICY, static_nodes, until

SECRET = b"0123456789abcdef-fleet-secret"
WINDOW_S = 1.0
CALLS_PER_TICK = 3  # per member, every TICK_S, for each tenant
TICK_S = 0.01


def _limits(path: Path, **acme: Any) -> str:
    rows = [
        {**POLICY, "tenant_id": "acme", "mode": "local", "target_rate": 5000, "global_burst": 500}
        | acme,
        dict(POLICY, tenant_id="beta", mode="local", target_rate=5000, global_burst=500),
    ]
    path.write_text(yaml.safe_dump(rows))
    return str(path)


@pytest.mark.slow
def test_preview_reads_the_fleets_traffic_and_says_what_a_tighter_limit_would_deny(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RATEMESH_API_KEY", "dev-key")  # the in-process coordinator checks none
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    os.chmod(secret, 0o600)
    cfgs = static_nodes(["a", "b"], fleet_secret_file=str(secret))
    current = _limits(tmp_path / "current.yaml")
    for cfg in cfgs:
        cfg["policies"] = {"file": current, "watch_ms": 0}
    config_a = tmp_path / "a.yaml"
    config_a.write_text(yaml.safe_dump(cfgs[0]))
    tighter = _limits(
        tmp_path / "tighter.yaml", generation=2, mode="global", target_rate=50, global_burst=10
    )
    shadow = _limits(tmp_path / "shadow.yaml", generation=2, posture="shadow")

    def preview(file: str, *extra: str) -> tuple[int, dict[str, Any], str]:
        capsys.readouterr()
        now = ["--current", current] if "--coordinator" not in extra else []
        argv = ["policy", "preview", file, *now, "--config", str(config_a)]
        rc = mesh_main([*argv, "--window", str(WINDOW_S), "--json", *extra])
        out = capsys.readouterr()
        assert "Traceback" not in out.err
        return rc, json.loads(out.out) if out.out else {}, out.err

    async def main() -> None:
        async with Mesh(cfgs[0]) as a, Mesh(cfgs[1]) as b:
            nodes = (a, b)
            await until(lambda: all(len(n.ring) == 2 for n in nodes), 5, "ring complete")
            server = CoordinatorServer(PolicyStore())  # governord's part: its current policies
            governord = await server.start()
            client = CoordinatorClient(governord, timeout_s=5.0)
            for row in yaml.safe_load(Path(current).read_text()):
                await client.put(row)
            await client.close()
            stop = asyncio.Event()

            async def load(node: Mesh) -> None:
                while not stop.is_set():
                    for _ in range(CALLS_PER_TICK):
                        for tenant in ("acme", "beta"):
                            assert node.try_admit(tenant, "read_iops")
                    await asyncio.sleep(TICK_S)

            drivers = [asyncio.create_task(load(n)) for n in nodes]
            try:
                await asyncio.sleep(0.2)
                rc, report, err = await asyncio.to_thread(preview, tighter)
                assert rc == 0, err
                assert report["members"] == 2 and report["meters_omitted"] == 0
                (row,) = report["rows"]  # beta's limit does not change
                assert (row["tenant"], row["from_generation"], row["to_generation"]) == (
                    "acme",
                    1,
                    2,
                )
                # two members, CALLS_PER_TICK a TICK_S each: well above 50/s + 10
                assert row["admitted_now"] > 100, row
                assert row["offered"] == row["admitted_now"]  # nothing denied now
                assert row["would_admit"] == min(row["offered"], int(50 * WINDOW_S) + 10)
                assert row["would_deny"] == row["offered"] - row["would_admit"] > 0

                rc, report, err = await asyncio.to_thread(preview, shadow)
                assert rc == 0, err
                (row,) = report["rows"]
                assert row["would_deny"] == 0 and row["would_admit"] == row["offered"] > 0

                # the current policies from governord instead of a file: the same answer
                rc, report, err = await asyncio.to_thread(
                    preview, tighter, "--coordinator", governord
                )
                assert rc == 0, err
                (row,) = report["rows"]
                assert (row["tenant"], row["from_generation"]) == ("acme", 1)
                assert row["would_admit"] == min(row["offered"], int(50 * WINDOW_S) + 10)
            finally:
                stop.set()
                await asyncio.gather(*drivers)
                await server.stop()

        # the fleet is gone: one line, exit 1
        rc, report, err = await asyncio.to_thread(preview, tighter, "--timeout", "0.5")
        assert rc == 1 and report == {} and len(err.strip().splitlines()) == 1, err

    asyncio.run(main())


def test_preview_mistakes_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = _limits(tmp_path / "current.yaml")
    for argv, says in (
        (["--window", "0"], "--window"),
        (["--window", "1", "--timeout", "-1"], "--timeout"),
        ([], "--addr"),
        (["--addr", "nohost"], "--addr"),
    ):
        rc = mesh_main(["policy", "preview", current, "--current", current, *argv])
        err = capsys.readouterr().err
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump([dict(POLICY, mode="strict", posture="shadow")]))
    rc = mesh_main(["policy", "preview", str(bad), "--current", current, "--addr", "h:1"])
    err = capsys.readouterr().err
    assert rc == 2 and "posture" in err and "strict" in err, err

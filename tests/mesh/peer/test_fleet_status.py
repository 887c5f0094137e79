"""`mesh status --fleet`: every ring member's enforced generation per limit over
real gRPC, proved with the fleet secret; divergence and unreachable members flagged, exit 1;
a member's malformed answer is flagged, never a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench._procs import read_ready, spawn, stop
from mesh.cli import main as mesh_main
from mesh.errors import MessageError
from mesh.node import Mesh
from mesh.telemetry import MemberAnswer, enforced_of, fleet_report, fleet_table
from tests.mesh._util import POLICY, run_mesh, static_nodes, until, wait_for

SECRET = b"0123456789abcdef-fleet-secret"


def test_the_report_flags_different_generations_missing_limits_and_silent_members() -> None:
    a, b = ("acme", "read_iops"), ("beta", "read_iops")
    same = [MemberAnswer("m1", "h:1", {a: 2, b: 1}), MemberAnswer("m2", "h:2", {a: 2, b: 1})]
    ok = fleet_report(same)
    assert (ok["diverged"], ok["diverged_limits"], ok["unreachable"]) == (False, 0, [])
    assert "converged" in fleet_table(ok)

    split = fleet_report([*same, MemberAnswer("m3", "h:3", {a: 1})])
    rows = {(r["tenant"], r["metric"]): r for r in split["limits"]}
    assert rows[a]["generations"] == {"m1": 2, "m2": 2, "m3": 1} and rows[a]["diverged"]
    assert rows[b]["generations"]["m3"] is None and rows[b]["diverged"]  # it has none
    assert split["diverged_limits"] == 2 and split["diverged"]

    gone = fleet_report([*same, MemberAnswer("m3", "h:3", None, "status h:3: UNAVAILABLE")])
    assert gone["unreachable"] == ["m3"] and gone["diverged"] and gone["diverged_limits"] == 0
    assert "UNREACHABLE: status h:3: UNAVAILABLE" in fleet_table(gone)


@pytest.mark.parametrize(
    "answer",
    [
        None,
        {},
        {"policies": {"enforced": "acme"}},
        {"policies": {"enforced": [["acme", "read_iops", 1]]}},
        {"policies": {"enforced": [{"tenant": "acme", "metric": "read_iops"}]}},
        {"policies": {"enforced": [{"tenant": 1, "metric": "read_iops", "generation": 1}]}},
        {"policies": {"enforced": [{"tenant": "a", "metric": "m", "generation": -1}]}},
        {"policies": {"enforced": [{"tenant": "a", "metric": "m", "generation": True}]}},
        {"policies": {"enforced": [{"tenant": "a" * 300, "metric": "m", "generation": 1}]}},
        {"policies": {"enforced": [{"tenant": "a", "metric": "m", "generation": 1}] * 10_001}},
    ],
)
def test_a_malformed_answer_is_a_message_error(answer: Any) -> None:
    with pytest.raises(MessageError):
        enforced_of(answer)


def _policy_file(path: Path, *generations: int) -> str:
    path.write_text(yaml.safe_dump([dict(POLICY, generation=g) for g in generations]))
    return str(path)


def test_fleet_status_over_grpc_flags_divergence_and_silence_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    os.chmod(secret, 0o600)
    ids = ["a", "b", "c"]
    cfgs = static_nodes(ids, fleet_secret_file=str(secret))
    files = {m: tmp_path / f"policies-{m}.yaml" for m in ids}
    for m, cfg in zip(ids, cfgs, strict=True):
        cfg["policies"] = {"file": _policy_file(files[m], 1), "watch_ms": 0}
    config_a = tmp_path / "a.yaml"
    config_a.write_text(yaml.safe_dump(cfgs[0]))

    def fleet(*extra: str) -> tuple[int, dict[str, Any], str]:
        capsys.readouterr()
        rc = mesh_main(["status", "--fleet", "--config", str(config_a), "--timeout", "5", *extra])
        out = capsys.readouterr()
        assert "Traceback" not in out.err
        if "--table" in extra:
            return rc, {"table": out.out}, out.err
        return rc, json.loads(out.out) if out.out else {}, out.err

    async def main() -> None:
        async with Mesh(cfgs[0]) as a, Mesh(cfgs[1]) as b, Mesh(cfgs[2]) as c:
            nodes = (a, b, c)
            await until(lambda: all(len(n.ring) == 3 for n in nodes), 5, "rings complete")
            rc, report, err = await asyncio.to_thread(fleet)
            assert rc == 0 and not report["diverged"], err
            assert [r["generations"] for r in report["limits"]] == [{"a": 1, "b": 1, "c": 1}]
            assert "converged" in err

            _policy_file(files["b"], 1, 2)  # b alone learns generation 2
            assert b.reload_policies() is True
            rc, report, err = await asyncio.to_thread(fleet)
            assert rc == 1 and report["diverged_limits"] == 1, err
            assert report["limits"][0]["generations"] == {"a": 1, "b": 2, "c": 1}
            assert "DIVERGED" in err

            for m, node in (("a", a), ("c", c)):
                _policy_file(files[m], 1, 2)
                assert node.reload_policies() is True
            rc, report, err = await asyncio.to_thread(fleet, "--table")
            assert rc == 0 and err == ""  # --table: the table alone, on stdout
            assert report["table"].splitlines()[-1].startswith("converged: 3 members")

            await c.aclose()  # c leaves gracefully; a may not have seen it go yet
            rc, report, err = await asyncio.to_thread(fleet, "--json")
            assert err == ""
            assert set(report["members"]) <= set(ids) and "c" not in [
                m for m, v in report["members"].items() if v["reachable"]
            ]
            assert rc == (1 if "c" in report["members"] else 0)

        # the member asked is gone: one line, exit 1
        rc, report, err = await asyncio.to_thread(fleet, "--timeout", "0.5")
        assert rc == 1 and report == {} and len(err.strip().splitlines()) == 1, err

    asyncio.run(main())


def test_an_unreachable_member_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """b is in a's static member list but never started: a's ring holds it, it cannot answer."""
    cfgs = static_nodes(["a", "b"])

    async def main() -> None:
        async with Mesh(cfgs[0]) as a:
            await until(lambda: len(a.ring) == 2, 5, "ring")
            rc = await asyncio.to_thread(
                mesh_main, ["status", "--fleet", "--addr", a.address, "--timeout", "1", "--json"]
            )
            report = json.loads(capsys.readouterr().out)
            assert rc == 1 and report["unreachable"] == ["b"]
            assert report["members"]["a"]["reachable"] and report["members"]["b"]["error"]
            assert report["limits"][0]["generations"] == {"a": 1}

    asyncio.run(main())


@pytest.mark.parametrize(
    "argv, names",
    [
        (["status", "--fleet", "--addr", "nope"], "--addr"),
        (["status", "--fleet"], "--addr"),
        (["status", "--fleet", "--addr", "127.0.0.1:1", "--timeout", "nan"], "--timeout"),
        (["bench", "policy", "--nodes", "0"], "--nodes"),
        (["bench", "policy", "--pushes", "0"], "--pushes"),
    ],
)
def test_a_mistake_is_one_line_naming_the_flag(
    argv: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mesh_main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert out.out == "" and len(lines) == 1 and names in lines[0], out.err


@pytest.mark.slow
def test_fleet_status_of_real_node_processes(tmp_path: Path) -> None:
    """Two `mesh node` processes with their own policy files; `mesh status --fleet` run as
    an operator runs it, before and after one of them is told (SIGHUP) of generation 2."""
    ids = ["a", "b"]
    cfgs = static_nodes(ids)
    files = {m: tmp_path / f"policies-{m}.yaml" for m in ids}
    procs = []
    try:
        for m, cfg in zip(ids, cfgs, strict=True):
            cfg["policies"] = {"file": _policy_file(files[m], 1), "watch_ms": 0}
            (tmp_path / f"{m}.yaml").write_text(yaml.safe_dump(cfg))
            procs.append(spawn(["-m", "mesh.cli", "node", "--config", str(tmp_path / f"{m}.yaml")]))
        addr = [read_ready(p)["address"] for p in procs][0]

        def fleet() -> tuple[int, dict[str, Any]]:
            out = run_mesh("status", "--fleet", "--addr", addr, "--json")
            assert "Traceback" not in out.stderr
            return out.returncode, json.loads(out.stdout)

        wait_for(lambda: fleet()[0] == 0, 10, "both members answer and agree")
        _policy_file(files["b"], 1, 2)
        procs[1].send_signal(signal.SIGHUP)
        wait_for(lambda: fleet()[0] == 1, 10, "the divergence is seen")
        rc, report = fleet()
        assert report["limits"][0]["generations"] == {"a": 1, "b": 2}
        assert report["diverged_limits"] == 1 and report["unreachable"] == []
    finally:
        for p in procs:
            stop(p)

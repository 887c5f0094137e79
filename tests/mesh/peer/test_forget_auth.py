"""ForgetMember is proved as a Status call is, over its own word: a mesh with a fleet secret
refuses a call without a proof and one signed for Status, and `mesh fleet forget-member
--config` (the node's secret) is answered by every member."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import yaml

from mesh.cli import main as mesh_main
from mesh.errors import PeerRefused
from mesh.node import Mesh
from mesh.peer import forget_member
from mesh.peer._identity import AUTH_MD, STATUS_EPOCH
from mesh.peer._link import open_channel
from mesh.peer._status import STATUS_CALLER, status_proof
from mesh.peer._wire import FORGET, MEMBER_MD, pack
from tests.mesh._util import static_nodes, until

SECRET = b"0123456789abcdef-fleet-secret"


def test_forget_member_needs_its_own_proof(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    os.chmod(secret, 0o600)
    cfgs = static_nodes(["a", "b"], fleet_secret_file=str(secret))
    config_a = tmp_path / "a.yaml"
    config_a.write_text(yaml.safe_dump(cfgs[0]))
    addr_b = cfgs[1]["listen"]

    async def main() -> None:
        async with Mesh(cfgs[0]) as a, Mesh(cfgs[1]) as b:
            await until(lambda: len(a.ring) == 2 and len(b.ring) == 2, 5, "ring")
            with pytest.raises(PeerRefused, match="PERMISSION_DENIED"):
                await forget_member(addr_b, "gone", target="b", timeout_s=5)
            status_md = (
                (MEMBER_MD, STATUS_CALLER),
                (AUTH_MD, status_proof(SECRET, "b", STATUS_EPOCH)),
            )
            async with open_channel(addr_b, None, 1 << 20) as channel:
                with pytest.raises(Exception, match="PERMISSION_DENIED"):
                    await channel.unary_unary(FORGET)(
                        pack({"member": "gone"}), timeout=5, metadata=status_md
                    )
            answer = await forget_member(
                addr_b, "gone", target="b", fleet_secret=SECRET, timeout_s=5
            )
            assert answer["member_id"] == "b" and answer["folds_cells"] == 0
            with pytest.raises(PeerRefused, match="INVALID_ARGUMENT.*is this member"):
                await forget_member(addr_b, "b", target="b", fleet_secret=SECRET, timeout_s=5)

            capsys.readouterr()
            argv = ["fleet", "forget-member", "gone", "--config", str(config_a)]
            rc = await asyncio.to_thread(mesh_main, argv)
            out = capsys.readouterr()
            assert rc == 0, out.err
            report = json.loads(out.out)
            assert report["failed"] == 0 and report["folds_cells"] == 0
            assert sorted(r["member_id"] for r in report["members"]) == ["a", "b"]

    asyncio.run(main())

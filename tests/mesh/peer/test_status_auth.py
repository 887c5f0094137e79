"""The Status call behind `mesh status` asks for the same proof as a peer stream:
a fleet-secret proof where the mesh has a secret, a client certificate where it requires
mTLS; otherwise PERMISSION_DENIED, counted in ratemesh_peer_refused_total{reason}. A dev
mesh with neither answers anyone. All over real gRPC; the CLI answers in one line."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc import aio

from mesh.cli import main as mesh_main
from mesh.config import TlsConfig
from mesh.errors import PeerRefused
from mesh.node import Mesh
from mesh.peer import MEMBER_MD, fetch_status
from mesh.peer._identity import AUTH_MD
from mesh.peer._status import STATUS_CALLER, status_proof
from mesh.peer._wire import STATUS, pack
from tests.mesh._util import http_get, until
from tests.mesh.peer._certs import tls_for
from tests.mesh.peer.test_identity import SECRET, _md, _node, _proof, _refused, _secret_file


def _status_proof(*, secret: bytes = SECRET, target: str = "n") -> str:
    return status_proof(secret, target)


async def _raw(addr: str, md: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    async with aio.insecure_channel(addr) as ch:
        try:
            await ch.unary_unary(STATUS)(pack({}), metadata=md, timeout=5)
        except aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_status_needs_the_fleet_secret_where_the_mesh_has_one(tmp_path: Path) -> None:
    async def main() -> None:
        async with Mesh(_node(["good"], fleet_secret_file=_secret_file(tmp_path))) as node:
            await until(lambda: len(node.ring) == 2, 2, "ring")
            addr = node.address
            for name, kw in (
                ("wrong secret", {"fleet_secret": b"w" * 32}),
                ("another member's", {"fleet_secret": SECRET, "target": "good"}),
                ("for any member", {"fleet_secret": SECRET, "target": "*"}),
            ):
                with pytest.raises(PeerRefused, match="PERMISSION_DENIED") as err:
                    await fetch_status(addr, **kw)
                assert "ratemesh-auth" in str(err.value), (name, err.value)
            assert _refused(node)["bad_secret"] == 3
            # no proof: refused (not counted: it is how a caller learns whom to prove to)
            with pytest.raises(PeerRefused, match="metadata is required"):
                await fetch_status(addr)
            assert _refused(node)["bad_secret"] == 3
            # proved for this member: named, or learnt from the refusal of a call without
            # a proof (an address is all the caller knows)
            for target in ("n", None):
                status = await fetch_status(addr, fleet_secret=SECRET, target=target)
                assert status["member_id"] == "n"
            assert _refused(node)["bad_secret"] == 3
            # one proof, once: a replayed header is refused
            md = ((MEMBER_MD, STATUS_CALLER), (AUTH_MD, _status_proof()))
            assert await _raw(addr, md) == grpc.StatusCode.OK
            assert await _raw(addr, md) == grpc.StatusCode.PERMISSION_DENIED
            # a proof for another member, captured there, does not open this one
            other = ((MEMBER_MD, STATUS_CALLER), (AUTH_MD, _status_proof(target="good")))
            assert await _raw(addr, other) == grpc.StatusCode.PERMISSION_DENIED
            # a stream's proof does not open Status, nor a Status proof a stream
            stream_md = _md("good", proof=_proof("good"))
            assert await _raw(addr, stream_md) == grpc.StatusCode.PERMISSION_DENIED
            assert _refused(node)["bad_secret"] == 6
            text = (await asyncio.to_thread(http_get, node.telemetry_address, "/metrics")).text
            assert 'ratemesh_peer_refused_total{reason="bad_secret"} 6.0' in text

    asyncio.run(main())


def test_a_dev_mesh_answers_status_without_a_proof() -> None:
    async def main() -> None:
        async with Mesh(_node(["good"])) as node:
            assert (await fetch_status(node.address))["member_id"] == "n"
            assert sum(_refused(node).values()) == 0

    asyncio.run(main())


def _cli(*argv: str) -> int:
    return mesh_main(["status", *argv, "--json", "--timeout", "5"])


def test_the_cli_proves_itself_with_the_config_or_a_secret_file_and_says_no_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = _secret_file(tmp_path)
    cfg: dict[str, Any] = _node(["good"], fleet_secret_file=secret)
    path = tmp_path / "n.yaml"
    path.write_text(yaml.safe_dump(cfg))

    async def main() -> None:
        async with Mesh(cfg) as node:
            await until(lambda: len(node.ring) == 2, 2, "ring")
            capsys.readouterr()
            assert await asyncio.to_thread(_cli, "--addr", node.address) == 1
            out = capsys.readouterr()
            lines = out.err.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in out.err, out.err
            assert lines[0].startswith("mesh status:") and "PERMISSION_DENIED" in lines[0]
            assert out.out == ""
            for argv in (
                ("--config", str(path)),
                ("--addr", node.address, "--fleet-secret-file", secret),
            ):
                assert await asyncio.to_thread(_cli, *argv) == 0, capsys.readouterr().err
                assert '"member_id": "n"' in capsys.readouterr().out
            assert _refused(node)["bad_secret"] == 0  # the proof-less call is not counted
            # a mistake in the secret file: one line naming the flag, exit 2
            bad = tmp_path / "short"
            bad.write_bytes(b"short\n")
            assert (
                await asyncio.to_thread(
                    _cli, "--addr", node.address, "--fleet-secret-file", str(bad)
                )
                == 2
            )
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "--fleet-secret-file" in err[0], err

    asyncio.run(main())


@pytest.mark.slow
def test_status_needs_a_client_certificate_where_the_mesh_requires_mtls(certs: Path) -> None:
    async def main() -> None:
        cfg = _node(["b", "c"], tls=tls_for(certs, "a"))
        cfg["member_id"] = "a"
        cfg["membership"]["members"]["a"] = cfg["membership"]["members"].pop("n")
        async with Mesh(cfg) as node:
            with_cert = TlsConfig(
                str(certs / "b.pem"), str(certs / "b.key"), str(certs / "ca.pem"), True
            )
            assert (await fetch_status(node.address, tls=with_cert))["member_id"] == "a"
            # no client certificate: the handshake itself refuses the caller
            creds = grpc.ssl_channel_credentials(root_certificates=(certs / "ca.pem").read_bytes())
            async with aio.secure_channel(node.address, creds) as ch:
                with pytest.raises(aio.AioRpcError) as err:
                    await ch.unary_unary(STATUS)(pack({}), timeout=2)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(main())

"""Peer TLS and mutual TLS with certificate files from the config (made here by openssl)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from mesh.core.policy import Metric, RateKey
from mesh.node import Mesh
from mesh.peer import EXCHANGE
from tests.mesh._util import POLICY, static_nodes, until

pytestmark = pytest.mark.slow  # openssl makes the certificates; seconds

KEY = RateKey("acme", Metric.READ_IOPS, 1)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("certs")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=ratemesh-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=d,
    )
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("peer", "stranger"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=d,
        )
        if name == "peer":
            _openssl(
                "x509",
                "-req",
                "-in",
                "peer.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "san.cnf",
                "-out",
                "peer.pem",
                cwd=d,
            )
        else:  # self-signed: not from our CA
            _openssl(
                "x509",
                "-req",
                "-in",
                "stranger.csr",
                "-signkey",
                "stranger.key",
                "-days",
                "2",
                "-out",
                "stranger.pem",
                cwd=d,
            )
    return d


def test_mutual_tls_between_members(certs: Path) -> None:
    tls = {
        "cert": str(certs / "peer.pem"),
        "key": str(certs / "peer.key"),
        "ca": str(certs / "ca.pem"),
        "require_client_cert": True,
    }

    async def main() -> None:
        cfgs = static_nodes(["a", "b"], tls=tls)
        async with Mesh(cfgs[0]) as a, Mesh(cfgs[1]) as b:
            await until(lambda: len(a.ring) == 2 and len(b.ring) == 2, 2, "rings")
            owner, worker = (a, b) if a.ring.owner_of(KEY) == "a" else (b, a)
            n = sum(worker.try_admit("acme", "read_iops").allowed for _ in range(5))
            await until(
                lambda: owner.health()["owner"]["applied_units"] == n,
                3,
                "reports crossed mutual TLS",
            )
            addr = owner.address
            assert await asyncio.to_thread(_call_refused, addr, grpc.insecure_channel(addr))
            stranger = grpc.ssl_channel_credentials(
                root_certificates=(certs / "ca.pem").read_bytes(),
                private_key=(certs / "stranger.key").read_bytes(),
                certificate_chain=(certs / "stranger.pem").read_bytes(),
            )
            assert await asyncio.to_thread(_call_refused, addr, grpc.secure_channel(addr, stranger))
            assert owner.health()["owner"]["applied_units"] == n

    asyncio.run(main())


def _call_refused(addr: str, channel: grpc.Channel) -> bool:
    """A client without a certificate from our CA cannot open a stream."""

    def attempt() -> bool:
        with channel:
            call = channel.stream_stream(EXCHANGE)(iter([b"x"]), timeout=2)
            try:
                next(iter(call))
            except grpc.RpcError as exc:
                return exc.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
            return False

    return attempt()


def test_policy_with_tls_needs_ca_for_client_certs(certs: Path) -> None:
    from mesh.config import parse_config
    from mesh.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "tls": {
                    "cert": str(certs / "peer.pem"),
                    "key": str(certs / "peer.key"),
                    "require_client_cert": True,
                }
            }
        )
    assert err.value.field == "tls.ca"
    cfg = parse_config(
        {
            "member_id": "a",
            "listen": "10.0.0.1:7000",
            "tls": {
                "cert": str(certs / "peer.pem"),
                "key": str(certs / "peer.key"),
                "ca": str(certs / "ca.pem"),
            },
            "policies": {"inline": [POLICY]},
        }
    )
    assert not [w for w in cfg.warnings() if "tls" in w]

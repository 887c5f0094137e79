"""Peer TLS and mutual TLS with certificate files from the config (made here by openssl)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from mesh.core.policy import Metric, RateKey
from mesh.node import Mesh
from mesh.peer import EXCHANGE
from tests.mesh._util import POLICY, static_nodes, until
from tests.mesh.peer._certs import tls_for

pytestmark = pytest.mark.slow  # openssl makes the certificates; seconds

KEY = RateKey("acme", Metric.READ_IOPS, 1)


def test_mutual_tls_between_members(certs: Path) -> None:
    async def main() -> None:
        cfgs = [dict(c, tls=tls_for(certs, c["member_id"])) for c in static_nodes(["a", "b"])]
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
                    "cert": str(certs / "a.pem"),
                    "key": str(certs / "a.key"),
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
                "cert": str(certs / "a.pem"),
                "key": str(certs / "a.key"),
                "ca": str(certs / "ca.pem"),
            },
            "policies": {"inline": [POLICY]},
        }
    )
    assert not [w for w in cfg.warnings() if w.startswith("tls")]

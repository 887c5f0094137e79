"""Beyond loopback with mutual TLS and no fleet secret: the sidecar serves the peer port's
certificates and a caller proves itself with a client certificate from the fleet's CA."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import grpc
import httpx
import pytest

from mesh.sidecar import admission_pb2 as pb
from tests._addresses import on_loopback
from tests.mesh.peer._certs import tls_for
from tests.mesh.sidecar._node import admit_call, item, node, node_config, pairs


def test_mutual_tls_admits_a_fleet_certificate_and_refuses_none(certs: Path) -> None:
    async def main() -> None:
        cfg = node_config(
            {"grpc_listen": "0.0.0.0:0", "http_listen": "0.0.0.0:0"}, tls=tls_for(certs, "a")
        )
        async with node(cfg) as mesh:
            g = on_loopback(mesh.sidecar_addresses["grpc"])
            h = on_loopback(mesh.sidecar_addresses["http"])
            ca = (certs / "ca.pem").read_bytes()
            good = grpc.ssl_channel_credentials(
                ca, (certs / "b.key").read_bytes(), (certs / "b.pem").read_bytes()
            )
            async with grpc.aio.secure_channel(g, good) as ch:
                resp = await admit_call(ch)(pb.AdmitRequest(items=[item()]))
                assert pairs(resp) == [(True, "admitted")]
            async with grpc.aio.secure_channel(g, grpc.ssl_channel_credentials(ca)) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await admit_call(ch)(pb.AdmitRequest(items=[item()]), timeout=5)
                assert e.value.code() is grpc.StatusCode.UNAVAILABLE
            ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
            ctx.load_cert_chain(str(certs / "b.pem"), str(certs / "b.key"))
            async with httpx.AsyncClient(verify=ctx, timeout=5) as c:
                r = await c.post(
                    f"https://{h}/v1/admit", json={"tenant": "acme", "metric": "read_iops"}
                )
                assert r.status_code == 200 and r.json()["allowed"] is True
            bare = ssl.create_default_context(cafile=str(certs / "ca.pem"))
            async with httpx.AsyncClient(verify=bare, timeout=5) as c:
                with pytest.raises((httpx.HTTPError, ssl.SSLError)):
                    await c.post(
                        f"https://{h}/v1/admit", json={"tenant": "acme", "metric": "read_iops"}
                    )

    asyncio.run(main())

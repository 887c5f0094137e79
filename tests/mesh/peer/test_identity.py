"""Peer identity and stream bounds , hostile input sent through real
gRPC to a real node: a certificate for one member claiming another, a missing, wrong,
misdirected, stale or replayed fleet-secret proof, a member id outside the ring, and more
streams than the bounds allow. Each is refused at the stream's open with a status naming
what was wrong, counted per reason, and changes nothing; an honest member still works."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from bench._procs import free_port
from mesh.core.messages import ReportBatch, SnapshotBatch, UsageReport, decode, encode
from mesh.core.policy import Metric, RateKey
from mesh.node import Mesh
from mesh.peer import EPOCH_MD, EXCHANGE, MEMBER_MD, SCHEMA_MD
from mesh.peer._identity import AUTH_MD, AUTH_SKEW_S, NonceMemory, RefusalLog, sign
from mesh.peer._server import STREAMS_PER_PEER_MAX
from mesh.peer._wire import SCHEMA
from tests.mesh._util import POLICY, http_get, static_nodes, until
from tests.mesh.peer._certs import tls_for

KEY = RateKey("acme", Metric.READ_IOPS, 1)
SECRET = b"0123456789abcdef-fleet-secret"


def _report(sender: str, epoch: int, seq: int, key: RateKey = KEY) -> bytes:
    report = UsageReport(key, sender, epoch, seq, iops_delta=1, unacked_from=seq)
    return encode(ReportBatch.of(sender, 1, (report,)))


def _md(member: str, epoch: int = 7, proof: str | None = None) -> tuple[tuple[str, str], ...]:
    md = ((MEMBER_MD, member), (SCHEMA_MD, SCHEMA), (EPOCH_MD, str(epoch)))
    return md if proof is None else (*md, (AUTH_MD, proof))


def _proof(member: str, *, secret: bytes = SECRET, target: str = "n", epoch: int = 7,
           at_s: int | None = None) -> str:  # fmt: skip
    now = int(time.time()) if at_s is None else at_s
    return sign(secret, member=member, epoch=str(epoch), schema=SCHEMA, target=target, now_s=now)


class Stream:
    """One Exchange stream opened by a test client: a report out, its reply back."""

    def __init__(self, channel: aio.Channel, md: tuple[tuple[str, str], ...]) -> None:
        self.call = channel.stream_stream(EXCHANGE)(metadata=md, timeout=10)

    async def exchange(self, payload: bytes) -> tuple[grpc.StatusCode, str]:
        """OK once a snapshot batch answers `payload`; else the server's status."""
        await self.call.initial_metadata()  # admitted (headers) or refused (a status)
        if self.call.done():
            return await self.call.code(), await self.call.details()
        await self.call.write(payload)
        reply = await self.call.read()
        if reply is aio.EOF:
            return await self.call.code(), await self.call.details()
        assert isinstance(decode(reply), SnapshotBatch)
        return grpc.StatusCode.OK, ""

    def close(self) -> None:
        self.call.cancel()


async def _once(
    addr: str, md: tuple[tuple[str, str], ...], payload: bytes, creds: Any = None
) -> tuple[grpc.StatusCode, str]:
    channel = aio.secure_channel(addr, creds) if creds else aio.insecure_channel(addr)
    async with channel:
        s = Stream(channel, md)
        try:
            return await s.exchange(payload)
        finally:
            s.close()


def _node(members: list[str], **extra: Any) -> dict[str, Any]:
    """Member n's config in a static ring of n and `members` (who never run)."""
    addr = f"127.0.0.1:{free_port()}"
    ring = {"n": addr, **{m: f"127.0.0.1:{free_port()}" for m in members}}
    return {
        "member_id": "n",
        "listen": addr,
        "telemetry_listen": "127.0.0.1:0",
        "membership": {"source": "static", "members": ring},
        "policies": {"inline": [dict(POLICY, tenant_id=f"t{i}") for i in range(16)]},
        **extra,
    }


def _owned(node: Mesh) -> RateKey:
    """A key of the `_node` policies that n owns in its ring (so a report changes it)."""
    keys = [RateKey(f"t{i}", Metric.READ_IOPS, 1) for i in range(16)]
    return next(k for k in keys if node.ring.owner_of(k) == node.member_id)


def _refused(node: Mesh) -> dict[str, int]:
    return dict(node.health()["peer"]["refused"])


def _applied(node: Mesh) -> int:
    return int(node.health()["owner"]["applied_units"])


def _secret_file(tmp_path: Path, secret: bytes = SECRET) -> str:
    path = tmp_path / "fleet-secret"
    path.write_bytes(secret + b"\n")
    path.chmod(0o600)
    return str(path)


# -- mTLS: the member id must match the certificate ------------------------------------------


@pytest.mark.slow
def test_a_certificate_for_one_member_cannot_claim_another(certs: Path) -> None:
    def creds(name: str) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=(certs / "ca.pem").read_bytes(),
            private_key=(certs / f"{name}.key").read_bytes(),
            certificate_chain=(certs / f"{name}.pem").read_bytes(),
        )

    async def main() -> None:
        cfg = _node(["b", "c"], tls=tls_for(certs, "a"))
        cfg["member_id"] = "a"
        cfg["membership"]["members"]["a"] = cfg["membership"]["members"].pop("n")
        async with Mesh(cfg) as node:
            before = _applied(node)
            code, details = await _once(node.address, _md("c"), _report("c", 7, 1), creds("b"))
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
            assert "claims member 'c'" in details and "CN 'b'" in details, details
            assert "SAN 'b'" in details, details
            assert _refused(node)["bad_certificate"] == 1
            assert _applied(node) == before
            # the same certificate, honest: served
            code, details = await _once(node.address, _md("b"), _report("b", 7, 1), creds("b"))
            assert code == grpc.StatusCode.OK, details
            assert _refused(node)["bad_certificate"] == 1
            text = (await asyncio.to_thread(http_get, node.telemetry_address, "/metrics")).text
            assert 'ratemesh_peer_refused_total{reason="bad_certificate"} 1.0' in text

    asyncio.run(main())


# -- fleet secret: an HMAC over the stream's metadata ----------------------------------------


@pytest.mark.slow
def test_members_with_the_fleet_secret_exchange_reports(tmp_path: Path) -> None:
    secret = _secret_file(tmp_path)

    async def main() -> None:
        cfgs = [dict(c, fleet_secret_file=secret) for c in static_nodes(["a", "b"])]
        async with Mesh(cfgs[0]) as a, Mesh(cfgs[1]) as b:
            await until(lambda: len(a.ring) == 2 and len(b.ring) == 2, 2, "rings")
            owner, worker = (a, b) if a.ring.owner_of(KEY) == "a" else (b, a)
            n = sum(worker.try_admit("acme", "read_iops").allowed for _ in range(5))
            await until(lambda: _applied(owner) == n, 3, "reports crossed with the secret")
            assert sum(_refused(owner).values()) == 0

    asyncio.run(main())


@pytest.mark.slow
def test_a_member_with_another_secret_is_refused(tmp_path: Path) -> None:
    ours, theirs = _secret_file(tmp_path), str(tmp_path / "other")
    Path(theirs).write_bytes(b"another-secret-of-enough-bytes")

    async def main() -> None:
        cfgs = static_nodes(["a", "b"])
        cfgs = [dict(cfgs[0], fleet_secret_file=ours), dict(cfgs[1], fleet_secret_file=theirs)]
        async with Mesh(cfgs[0]) as a, Mesh(cfgs[1]) as b:
            await until(lambda: len(a.ring) == 2 and len(b.ring) == 2, 2, "rings")
            owner, worker = (a, b) if a.ring.owner_of(KEY) == "a" else (b, a)
            sum(worker.try_admit("acme", "read_iops").allowed for _ in range(5))
            await until(lambda: _refused(owner)["bad_secret"] >= 1, 3, "the stream refused")
            assert _applied(owner) == 0

            def said() -> str:
                return str(worker.health()["peer"]["links"][owner.member_id]["last_error"])

            await until(lambda: "PERMISSION_DENIED" in said(), 3, "the worker told")
            assert AUTH_MD in said()

    asyncio.run(main())


@pytest.mark.slow
def test_bad_fleet_secret_proofs_are_refused_and_change_nothing(tmp_path: Path) -> None:
    now = int(time.time())
    good = _proof("good")
    cases = [
        ("no proof", _md("good"), "metadata is required"),
        ("not a proof", _md("good", proof="v1:x"), "not a v1"),
        ("wrong secret", _md("good", proof=_proof("good", secret=b"x" * 20)), "wrong fleet"),
        ("another member's", _md("good", proof=_proof("other")), "wrong fleet"),
        ("for another target", _md("good", proof=_proof("good", target="good")), "wrong fleet"),
        ("other epoch", _md("good", epoch=8, proof=good), "wrong fleet"),
        (
            "stale",
            _md("good", proof=_proof("good", at_s=now - 2 * AUTH_SKEW_S)),
            f"accepted: +-{AUTH_SKEW_S} s",
        ),
    ]

    async def main() -> None:
        async with Mesh(_node(["good"], fleet_secret_file=_secret_file(tmp_path))) as node:
            await until(lambda: len(node.ring) == 2, 2, "ring")
            key = _owned(node)
            before = _applied(node)
            for name, md, says in cases:
                code, details = await _once(node.address, md, _report("good", 7, 1, key))
                assert code == grpc.StatusCode.PERMISSION_DENIED, (name, code, details)
                assert says in details, (name, details)
            assert _refused(node)["bad_secret"] == len(cases)
            assert _applied(node) == before
            # the honest proof opens once; the same header replayed is refused
            md = _md("good", proof=good)
            code, details = await _once(node.address, md, _report("good", 7, 1, key))
            assert code == grpc.StatusCode.OK, details
            assert _applied(node) == before + 1
            code, details = await _once(node.address, md, _report("good", 7, 2, key))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "already used" in details
            assert _applied(node) == before + 1
            # a process holding the secret but outside the ring
            md = _md("mallory", proof=_proof("mallory"))
            code, details = await _once(node.address, md, _report("mallory", 7, 1, key))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "not a member" in details
            assert _refused(node) == {
                "not_member": 1,
                "bad_certificate": 0,
                "bad_secret": len(cases) + 1,
                "stream_limit": 0,
                "bad_message": 0,
                "call_limit": 0,
                "slow_request": 0,
            }
            text = (await asyncio.to_thread(http_get, node.telemetry_address, "/metrics")).text
            assert f'ratemesh_peer_refused_total{{reason="bad_secret"}} {len(cases) + 1}.0' in text
            assert 'ratemesh_peer_refused_total{reason="not_member"} 1.0' in text

    asyncio.run(main())


# -- stream bounds ---------------------------------------------------------------------------


@pytest.mark.slow
def test_streams_are_bounded_per_member_and_in_all() -> None:
    async def main() -> None:
        async with Mesh(_node(["good", "other"])) as node:
            server = node._require().transport.server  # type: ignore[attr-defined]
            async with aio.insecure_channel(node.address) as ch:
                held = []
                for seq in range(1, STREAMS_PER_PEER_MAX + 1):
                    s = Stream(ch, _md("good"))
                    assert await s.exchange(_report("good", 7, seq)) == (grpc.StatusCode.OK, "")
                    held.append(s)
                extra = 100  # at once, each on its own connection
                got = await asyncio.gather(
                    *(_once(node.address, _md("good"), _report("good", 7, 1)) for _ in range(extra))
                )
                for code, details in got:
                    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
                    assert "STREAMS_PER_PEER_MAX" in details
                assert server.open_streams == STREAMS_PER_PEER_MAX
                # another member is still served
                code, details = await _once(node.address, _md("other"), _report("other", 7, 1))
                assert code == grpc.StatusCode.OK, details
                # the bound in all (lowered here: a real 1024 would take a thousand streams)
                server.streams_max = STREAMS_PER_PEER_MAX + 1
                first = Stream(ch, _md("other"))
                assert await first.exchange(_report("other", 7, 2)) == (grpc.StatusCode.OK, "")
                code, details = await _once(node.address, _md("other"), _report("other", 7, 3))
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "STREAMS_MAX" in details
                assert _refused(node)["stream_limit"] == extra + 1
                for s in (*held, first):
                    s.close()
                await until(lambda: server.open_streams == 0, 3, "closed streams counted out")
                code, details = await _once(node.address, _md("good"), _report("good", 7, 9))
                assert code == grpc.StatusCode.OK, details
            await until(lambda: node.health()["peer"]["open_streams"] == 0, 3, "all closed")

    asyncio.run(main())


def test_refusals_are_logged_at_most_once_a_second(caplog: pytest.LogCaptureFixture) -> None:
    log = RefusalLog(logging.getLogger("mesh.peer.test"), every_s=1.0)
    with caplog.at_level(logging.DEBUG, logger="mesh.peer.test"):
        for i in range(10):
            log.refused(100.0 + i * 0.05, "bad_secret", "ipv4:127.0.0.1:1", "mallory", "no")
        log.refused(101.5, "not_member", "ipv4:127.0.0.1:2", "eve", "not a member")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(warnings) == 2 and len(debug) == 9
    assert (
        "ipv4:127.0.0.1:1" in warnings[0].getMessage() and "'mallory'" in warnings[0].getMessage()
    )
    assert "9 more at debug" in warnings[1].getMessage()


@pytest.mark.slow
def test_during_a_rotation_every_listed_secret_is_accepted(tmp_path: Path) -> None:
    new = b"the-next-fleet-secret-0123456789"
    path = tmp_path / "rotating"
    path.write_bytes(SECRET + b"\n" + new + b"\n")

    async def main() -> None:
        async with Mesh(_node(["good"], fleet_secret_file=str(path))) as node:
            await until(lambda: len(node.ring) == 2, 2, "ring")
            key = _owned(node)
            for seq, secret in enumerate((SECRET, new), start=1):
                md = _md("good", proof=_proof("good", secret=secret))
                code, details = await _once(node.address, md, _report("good", 7, seq, key))
                assert code == grpc.StatusCode.OK, details
            md = _md("good", proof=_proof("good", secret=b"a-retired-secret-0123456789"))
            code, details = await _once(node.address, md, _report("good", 7, 3, key))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "wrong fleet secret" in details
            assert _refused(node)["bad_secret"] == 1

    asyncio.run(main())


def test_the_replay_memory_is_bounded_and_forgets_what_time_refuses() -> None:
    seen = NonceMemory(limit=3)
    assert seen.add(100, "a", 100) and not seen.add(100, "a", 100)
    assert seen.add(100, "b", 100) and seen.add(100, "c", 100)
    assert seen.add(100, "d", 100) and len(seen) == 3  # full: the oldest ("a") went
    assert not seen.add(100, "d", 100)
    assert seen.add(200, "e", 100 + AUTH_SKEW_S + 1) and len(seen) == 1  # the rest expired

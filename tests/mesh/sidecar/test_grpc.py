"""The gRPC Admission service through a real channel on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from mesh.sidecar import admission_pb2 as pb
from mesh.sidecar import verdict_fields
from mesh.sidecar._grpc import LIMIT_FIELDS
from tests._addresses import on_loopback
from tests.mesh.sidecar._node import (
    SECRET,
    admit_call,
    insecure,
    item,
    node,
    node_config,
    pairs,
    wire_fields,
)


def _sequence() -> list[pb.AdmitItem]:
    """Admissions past the burst, an amount over it, and a tenant without a policy."""
    return [
        *(item() for _ in range(4)),
        item(amount=2),
        item(amount=1),
        item(amount=50),
        item(tenant="nobody"),
        item(metric="client_egress_bytes", amount=300),
        item(metric="client_egress_bytes", amount=800),
    ]


def _timeless(fields: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in fields.items() if k != "reset_after_ms"}


def test_batch_admit_verdicts_equal_in_process_try_admit() -> None:
    async def main() -> None:
        seq = _sequence()
        async with node(node_config()) as served, node(node_config()) as local:
            async with insecure(served.sidecar_addresses["grpc"]) as ch:
                resp = await admit_call(ch)(pb.AdmitRequest(items=seq))
            want = [
                verdict_fields(local.try_admit_detailed(i.tenant, i.metric, i.amount or 1))
                for i in seq
            ]
            got = [wire_fields(v) for v in resp.verdicts]
            # every decided verdict carries its policy's exact limit, as the HTTP one does
            limits = [{k: g.pop(k, None) for k in LIMIT_FIELDS} for g in got]
            assert limits[0] == {
                "burst": 5,
                "rate": "1/second",
                "window": pb.Window(amount=1, period_s=1),
            }
            # The same decisions and numbers (a 1/s limit does not refill meanwhile); the
            # time until full is measured from each node's own last tick.
            assert [_timeless(g) for g in got] == [_timeless(w) for w in want]
            assert ["reset_after_ms" in g for g in got] == ["reset_after_ms" in w for w in want]
            assert got[0]["remaining"] == 4 and got[0]["retry_after_ms"] == 0
            assert got[4]["remaining"] == 1 and got[4]["retry_after_ms"] >= 1  # 2 asked
            allowed = [v.allowed for v in resp.verdicts]
            assert allowed == [True] * 4 + [False, True, False, False, True, False]
            assert [v.HasField("error") for v in resp.verdicts] == [False] * len(seq)

    asyncio.run(main())


def test_charge_and_refund_round_trip() -> None:
    async def main() -> None:
        async with node(node_config()) as mesh:
            async with insecure(mesh.sidecar_addresses["grpc"]) as ch:
                charge, refund = admit_call(ch, "Charge"), admit_call(ch, "Refund")
                egress = "client_egress_bytes"
                r = await charge(pb.AdmitRequest(items=[item(metric=egress, amount=1000)]))
                assert pairs(r) == [(True, "admitted")]
                r = await charge(pb.AdmitRequest(items=[item(metric=egress, amount=1)]))
                assert pairs(r) == [(False, "rate_limited")]
                ack = await refund(pb.AdmitRequest(items=[item(metric=egress, amount=400)]))
                assert [(a.ok, a.HasField("error")) for a in ack.acks] == [(True, False)]
                r = await charge(pb.AdmitRequest(items=[item(metric=egress, amount=400)]))
                assert pairs(r) == [(True, "admitted")]
                # a refund for a tenant that never charged: its ack says so, nothing changes
                ack = await refund(pb.AdmitRequest(items=[item(tenant="zed", metric=egress)]))
                assert not ack.acks[0].ok and ack.acks[0].error.startswith("tenant: ")

    asyncio.run(main())


def test_bad_items_get_their_own_error_and_change_nothing() -> None:
    async def main() -> None:
        bad = [
            item(tenant=""),
            item(metric="Read-IOPS"),
            item(metric="read_lops"),  # no policy of any tenant names it: a typo
            item(amount=-5),
            item(tenant="t" * 300),
            item(descriptors=[("path", "/a"), ("op", "get")]),
        ]
        async with node(node_config()) as mesh:
            async with insecure(mesh.sidecar_addresses["grpc"]) as ch:
                admit = admit_call(ch)
                resp = await admit(pb.AdmitRequest(items=[*bad, item()]))
                errors = [v.error for v in resp.verdicts[:-1]]
                assert [e.split(":")[0] for e in errors] == [
                    "tenant",
                    "metric",
                    "metric",
                    "amount",
                    "tenant",
                    "descriptors",
                ]
                assert "'Read-IOPS'" in errors[1]
                assert errors[2].startswith("metric: unknown metric 'read_lops'")
                assert "at most 1 (key, value) pair under the tenant" in errors[5]
                assert not any(v.allowed for v in resp.verdicts[:-1])
                assert pairs(resp)[-1] == (True, "admitted")
                # the bad items took nothing: the burst (5) has 4 left after the good one
                resp = await admit(pb.AdmitRequest(items=[item() for _ in range(5)]))
                assert [v.allowed for v in resp.verdicts] == [True] * 4 + [False]

    asyncio.run(main())


def test_a_descriptor_narrows_the_tenant_as_in_process() -> None:
    """One (key, value) pair under the tenant: with no policy of its own it falls back to
    the tenant's, charged on the tenant's key (docs/policies.md), as in process."""

    async def main() -> None:
        async with node(node_config()) as mesh:
            async with insecure(mesh.sidecar_addresses["grpc"]) as ch:
                admit = admit_call(ch)
                routed = item(descriptors=[("route", "/upload")])
                resp = await admit(pb.AdmitRequest(items=[routed, routed, item()]))
                assert [v.HasField("error") for v in resp.verdicts] == [False] * 3
                assert [v.remaining for v in resp.verdicts] == [4, 3, 2]  # one bucket
                bad = item(descriptors=[("route", "")])
                resp = await admit(pb.AdmitRequest(items=[bad]))
                assert resp.verdicts[0].error.startswith("descriptors[0].value: ")

    asyncio.run(main())


def test_malformed_and_oversized_calls_are_refused_whole() -> None:
    async def main() -> None:
        cfg = node_config({"grpc_listen": "127.0.0.1:0", "items_max": 10})
        async with node(cfg) as mesh:
            async with insecure(mesh.sidecar_addresses["grpc"]) as ch:
                admit = admit_call(ch)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await admit(pb.AdmitRequest(items=[item() for _ in range(11)]))
                assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert e.value.details() == "items: 11 in one call; at most 10 (split the batch)"
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await admit(b"\xff\xff\xff\xff garbage")
                assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "AdmitRequest: not a valid message" in (e.value.details() or "")
                # nothing was decided by either: the whole burst is still there
                resp = await admit(pb.AdmitRequest(items=[item() for _ in range(6)]))
                assert [v.allowed for v in resp.verdicts] == [True] * 5 + [False]

    asyncio.run(main())


def test_a_message_over_max_message_bytes_is_resource_exhausted() -> None:
    async def main() -> None:
        cfg = node_config({"grpc_listen": "127.0.0.1:0", "max_message_bytes": 2048})
        async with node(cfg) as mesh:
            async with insecure(mesh.sidecar_addresses["grpc"]) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await admit_call(ch)(pb.AdmitRequest(items=[item("x" * 250)] * 20))
                assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED

    asyncio.run(main())


def _secret_file(tmp_path: Path) -> str:
    path = tmp_path / "fleet.secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "0.0.0.0:0"])
def test_auth_a_call_without_the_fleet_secret_is_unauthenticated(
    tmp_path: Path, listen: str
) -> None:
    async def main() -> None:
        cfg = node_config(
            {"grpc_listen": listen, "require_auth": listen.startswith("127.")},
            fleet_secret_file=_secret_file(tmp_path),
            allow_plaintext=True,
        )
        async with node(cfg) as mesh:
            async with insecure(on_loopback(mesh.sidecar_addresses["grpc"])) as ch:
                admit = admit_call(ch)
                req = pb.AdmitRequest(items=[item()])
                for md, why in [
                    ((), "authorization: required (Bearer <token>)"),
                    ((("authorization", "Bearer wrong"),), "authorization: wrong token"),
                    ((("authorization", SECRET),), "authorization: expected 'Bearer <token>'"),
                ]:
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await admit(req, metadata=md)
                    assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
                    assert (e.value.details() or "").startswith(why)
                resp = await admit(req, metadata=(("authorization", f"Bearer {SECRET}"),))
                assert pairs(resp) == [(True, "admitted")]
                # the refused calls decided nothing: 4 of the burst of 5 are left
                resp = await admit(
                    pb.AdmitRequest(items=[item()] * 5),
                    metadata=(("authorization", f"Bearer {SECRET}"),),
                )
                assert [v.allowed for v in resp.verdicts] == [True] * 4 + [False]

    asyncio.run(main())


def test_the_sidecars_own_token_replaces_the_fleet_secret(tmp_path: Path) -> None:
    """With `sidecar.token_file` callers send that token, and the fleet secret (the peer
    port's credential, which workers then need not hold) is refused here."""
    token = tmp_path / "sidecar.token"
    token.write_text("worker-token-0123456789\n")

    async def main() -> None:
        cfg = node_config(
            {"grpc_listen": "0.0.0.0:0", "token_file": str(token)},
            fleet_secret_file=_secret_file(tmp_path),
            allow_plaintext=True,
        )
        async with node(cfg) as mesh:
            async with insecure(on_loopback(mesh.sidecar_addresses["grpc"])) as ch:
                admit = admit_call(ch)
                req = pb.AdmitRequest(items=[item()])
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await admit(req, metadata=(("authorization", f"Bearer {SECRET}"),))
                assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
                md = (("authorization", "Bearer worker-token-0123456789"),)
                assert pairs(await admit(req, metadata=md)) == [(True, "admitted")]

    asyncio.run(main())


def test_a_token_alone_lets_an_exposed_sidecar_start_and_a_missing_file_is_one_line(
    tmp_path: Path,
) -> None:
    from mesh.config import parse_config
    from mesh.errors import ConfigError

    token = tmp_path / "t"
    token.write_text("tok-0123456789-7f3a\n")
    side = {"grpc_listen": "0.0.0.0:7002", "token_file": str(token)}
    cfg = parse_config({"sidecar": side, "allow_plaintext": True})
    assert cfg.sidecar.tokens == (b"tok-0123456789-7f3a",)
    with pytest.raises(ConfigError) as e:
        parse_config({"sidecar": {**side, "token_file": str(tmp_path / "none")}})
    assert e.value.field == "sidecar.token_file" and "cannot read" in str(e.value)
    assert "\n" not in str(e.value)


def test_admit_stream_answers_each_batch_in_order_as_admit_does(tmp_path: Path) -> None:
    """AdmitStream: one response per request, in order, decided as Admit decides them (the
    burst of 5 spent across batches, a bad item its own error); the token is checked when
    the stream opens; a malformed message ends the stream INVALID_ARGUMENT."""

    async def main() -> None:
        cfg = node_config(
            {"grpc_listen": "127.0.0.1:0", "require_auth": True},
            fleet_secret_file=_secret_file(tmp_path),
        )
        md = (("authorization", f"Bearer {SECRET}"),)
        async with node(cfg) as mesh:
            async with insecure(mesh.sidecar_addresses["grpc"]) as ch:
                open_stream = ch.stream_stream(
                    "/ratemesh.sidecar.v1.Admission/AdmitStream",
                    request_serializer=pb.AdmitRequest.SerializeToString,
                    response_deserializer=pb.AdmitResponse.FromString,
                )
                s = open_stream(metadata=md)
                seen = []
                for batch in ([item(), item()], [item(), item(tenant="")], [item()] * 3):
                    await s.write(pb.AdmitRequest(items=batch))
                    resp = await s.read()
                    assert isinstance(resp, pb.AdmitResponse)
                    seen.append([(v.allowed, v.error.split(":")[0]) for v in resp.verdicts])
                await s.done_writing()
                assert await s.code() is grpc.StatusCode.OK
                assert seen == [
                    [(True, ""), (True, "")],
                    [(True, ""), (False, "tenant")],
                    [(True, ""), (True, ""), (False, "")],
                ]
                # without the token: refused when the stream opens, nothing decided
                s = open_stream()
                await s.write(pb.AdmitRequest(items=[item()]))
                assert await s.code() is grpc.StatusCode.UNAUTHENTICATED
                # a malformed message: the stream ends INVALID_ARGUMENT
                raw = ch.stream_stream(
                    "/ratemesh.sidecar.v1.Admission/AdmitStream",
                    request_serializer=None,
                    response_deserializer=None,
                )(metadata=md)
                await raw.write(b"\xff\xff\xff")
                assert await raw.code() is grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(main())

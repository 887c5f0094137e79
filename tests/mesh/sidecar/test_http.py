"""The HTTP/JSON routes through a real uvicorn server on loopback, and /metrics and
/health on the same server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from mesh.sidecar import verdict_fields
from tests._addresses import on_loopback
from tests.mesh.sidecar._node import SECRET, node, node_config

ONE = {"tenant": "acme", "metric": "read_iops"}


async def _post(addr: str, route: str, body: Any, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as c:
        if isinstance(body, bytes):
            return await c.post(f"http://{addr}/v1/{route}", content=body, **kw)
        return await c.post(f"http://{addr}/v1/{route}", json=body, **kw)


def _timeless(fields: dict[str, Any]) -> dict[str, Any]:
    """A verdict's fields but the time until full (each node measures from its own tick)
    and the policy's exact limit the HTTP side adds (test_http_limits.py)."""
    return {k: v for k, v in fields.items() if k not in _NOT_IN_PROCESS}


_NOT_IN_PROCESS = frozenset({"reset_after_ms", "rate", "window", "burst"})


def test_single_and_batch_admit_answer_as_try_admit_does() -> None:
    async def main() -> None:
        async with node(node_config()) as served, node(node_config()) as local:
            addr = served.sidecar_addresses["http"]
            r = await _post(addr, "admit", ONE)
            assert r.status_code == 200 and _timeless(r.json()) == _timeless(
                verdict_fields(local.try_admit_detailed("acme", "read_iops"))
            )
            assert r.json()["remaining"] == 4 and r.json()["retry_after_ms"] == 0
            items: list[dict[str, Any]] = [
                dict(ONE, amount=2),
                dict(ONE, amount=2),
                {**ONE, "tenant": "nobody"},
            ]
            r = await _post(addr, "admit", {"items": items})
            assert r.status_code == 200
            want = [
                verdict_fields(
                    local.try_admit_detailed(i["tenant"], i["metric"], i.get("amount", 1))
                )
                for i in items
            ]
            assert [_timeless(v) for v in r.json()["verdicts"]] == [_timeless(v) for v in want]
            # a denial is an answer: 200, allowed false (here: the burst of 5 is spent)
            assert [v["allowed"] for v in want] == [True, True, False]
            r = await _post(addr, "admit", ONE)
            assert r.status_code == 200 and r.json()["allowed"] is False
            assert r.json()["reason"] == "rate_limited"

    asyncio.run(main())


def test_charge_and_refund_round_trip() -> None:
    async def main() -> None:
        async with node(node_config()) as mesh:
            addr = mesh.sidecar_addresses["http"]
            egress = {"tenant": "acme", "metric": "client_egress_bytes"}
            r = await _post(addr, "charge", dict(egress, amount=1000))
            assert r.json()["allowed"] is True
            r = await _post(addr, "charge", dict(egress, amount=1))
            assert r.json()["allowed"] is False
            r = await _post(addr, "refund", dict(egress, amount=600))
            assert (r.status_code, r.json()) == (200, {"ok": True})
            r = await _post(
                addr,
                "refund",
                {
                    "items": [
                        dict(egress, amount=1),
                        {"tenant": "zed", "metric": "client_egress_bytes"},
                    ]
                },
            )
            acks = r.json()["acks"]
            assert acks[0] == {"ok": True} and not acks[1]["ok"]
            assert acks[1]["error"].startswith("tenant: ")
            r = await _post(addr, "charge", dict(egress, amount=600))
            assert r.json()["allowed"] is True

    asyncio.run(main())


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"{not json", 400, "body: not JSON"),
        ([1, 2], 400, "body: must be a JSON object"),
        ({"tenant": "acme"}, 400, "metric: required"),
        ({**ONE, "amount": -1}, 400, "amount: must be >= 0"),
        ({**ONE, "amount": True}, 400, "amount: must be an integer"),
        ({**ONE, "amount": 1.5}, 400, "amount: must be an integer"),
        ({**ONE, "metric": "Read-IOPS"}, 400, "metric: "),
        ({**ONE, "colour": "red"}, 400, "colour: unknown field"),
        ({**ONE, "descriptors": {"path": "/a", "op": "get"}}, 400, "descriptors: at most 1"),
        ({"items": {"a": 1}}, 400, "items: must be a list"),
        ({"items": [ONE], "x": 1}, 400, "x: unknown field"),
        ({"items": [ONE, 5]}, 400, "items[1]: must be a JSON object"),
        ({"items": [ONE] * 11}, 400, "items: 11 in one call; at most 10"),
        (b"[" + b" " * 5000 + b"]", 413, "body: larger than 4096 bytes"),
    ],
)
def test_bad_requests_are_refused_with_the_field_and_change_nothing(
    body: Any, status: int, error: str
) -> None:
    async def main() -> None:
        cfg = node_config(
            {"http_listen": "127.0.0.1:0", "items_max": 10, "max_message_bytes": 4096}
        )
        async with node(cfg) as mesh:
            addr = mesh.sidecar_addresses["http"]
            r = await _post(addr, "admit", body)
            assert r.status_code == status
            assert r.json()["error"].startswith(error), r.json()
            r = await _post(addr, "admit", {"items": [ONE] * 6})
            assert [v["allowed"] for v in r.json()["verdicts"]] == [True] * 5 + [False]

    asyncio.run(main())


def test_a_bad_item_in_a_batch_is_that_items_error() -> None:
    async def main() -> None:
        async with node(node_config()) as mesh:
            addr = mesh.sidecar_addresses["http"]
            r = await _post(addr, "admit", {"items": [{**ONE, "amount": -1}, ONE]})
            assert r.status_code == 200
            bad, good = r.json()["verdicts"]
            assert bad == {
                "allowed": False,
                "error": "amount: must be >= 0 (0: a peek, nothing charged) and < 2^63, got -1",
            }
            assert good["allowed"] is True

    asyncio.run(main())


def test_methods_and_paths() -> None:
    async def main() -> None:
        async with node(node_config()) as mesh:
            addr = mesh.sidecar_addresses["http"]
            async with httpx.AsyncClient(timeout=5) as c:
                r = await c.get(f"http://{addr}/v1/admit")
                assert r.status_code == 405 and r.headers["allow"] == "POST"
                r = await c.post(f"http://{addr}/v1/nope", json=ONE)
                assert r.status_code == 404
                r = await c.post(f"http://{addr}/metrics")
                assert r.status_code == 405
                r = await c.get(f"http://{addr}/metrics")
                assert r.status_code == 200 and "ratemesh_" in r.text
                r = await c.get(f"http://{addr}/health")
                assert r.status_code == 200 and "membership" in r.json()

    asyncio.run(main())


def test_telemetry_listen_apart_serves_only_metrics_and_health() -> None:
    async def main() -> None:
        cfg = node_config(telemetry_listen="127.0.0.1:0")
        async with node(cfg) as mesh:
            assert mesh.telemetry_address != mesh.sidecar_addresses["http"]
            async with httpx.AsyncClient(timeout=5) as c:
                r = await c.get(f"http://{mesh.telemetry_address}/health")
                assert r.status_code == 200
                r = await c.post(f"http://{mesh.telemetry_address}/v1/admit", json=ONE)
                assert r.status_code == 404

    asyncio.run(main())


def test_telemetry_listen_equal_to_http_listen_is_one_server() -> None:
    from bench._procs import free_port

    async def main() -> None:
        addr = f"127.0.0.1:{free_port()}"
        cfg = node_config({"http_listen": addr}, telemetry_listen=addr)
        async with node(cfg) as mesh:
            assert mesh.telemetry_address == mesh.sidecar_addresses["http"] == addr
            r = await _post(addr, "admit", ONE)
            assert r.json()["allowed"] is True

    asyncio.run(main())


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "0.0.0.0:0"])
def test_auth_a_request_without_the_fleet_secret_is_401(tmp_path: Path, listen: str) -> None:
    secret = tmp_path / "fleet.secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)

    async def main() -> None:
        cfg = node_config(
            {"http_listen": listen, "require_auth": True},
            fleet_secret_file=str(secret),
            allow_plaintext=True,
        )
        async with node(cfg) as mesh:
            addr = on_loopback(mesh.sidecar_addresses["http"])
            for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": SECRET}):
                r = await _post(addr, "admit", ONE, headers=headers)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
                assert r.json()["error"].startswith("authorization: ")
            good = {"authorization": f"Bearer {SECRET}"}
            r = await _post(addr, "admit", {"items": [ONE] * 6}, headers=good)
            assert [v["allowed"] for v in r.json()["verdicts"]] == [True] * 5 + [False]
            async with httpx.AsyncClient(timeout=5) as c:  # telemetry needs no token
                assert (await c.get(f"http://{addr}/health")).status_code == 200

    asyncio.run(main())


def test_a_port_in_use_is_refused_naming_the_field_and_stops_what_started() -> None:
    import socket

    from mesh.errors import ConfigError

    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            cfg = node_config({"grpc_listen": "127.0.0.1:0", "http_listen": f"127.0.0.1:{port}"})
            with pytest.raises(ConfigError) as e:
                async with node(cfg):
                    pass
            assert e.value.field == "sidecar.http_listen" and "in use" in str(e.value)
        # the gRPC server it had started is gone with it: the node starts again cleanly
        async with node(node_config()) as mesh:
            assert (await _post(mesh.sidecar_addresses["http"], "admit", ONE)).status_code == 200

    asyncio.run(main())


def test_a_threaded_node_serves_the_sidecar_from_its_loop_thread() -> None:
    from mesh.node import Mesh
    from mesh.peer import MemoryNetwork, MemoryTransport

    net = MemoryNetwork()
    mesh = Mesh(node_config(), transport=lambda mid, e, h: MemoryTransport(net, mid, h.deliver))
    mesh.start()
    try:
        addr = mesh.sidecar_addresses["http"]
        r = httpx.post(f"http://{addr}/v1/admit", json={"items": [ONE] * 6}, timeout=5)
        assert [v["allowed"] for v in r.json()["verdicts"]] == [True] * 5 + [False]
        assert mesh.try_admit("acme", "read_iops").allowed is False  # the same node's state
    finally:
        mesh.stop()


def test_cooldown_backs_the_limit_off_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPERATOR_TOKEN", "operator-token-0123456789abcdef")
    sidecar = {"http_listen": "127.0.0.1:0", "operator_token_env": "OPERATOR_TOKEN"}
    token = {"x-ratemesh-token": "operator-token-0123456789abcdef"}

    async def main() -> None:
        async with node(node_config(sidecar)) as mesh:
            addr = mesh.sidecar_addresses["http"]
            for bad, field in (
                ({**ONE, "cooldown_s": -1}, "cooldown_s"),
                ({**ONE, "cooldown_s": "long"}, "cooldown_s"),
                ({**ONE, "extra": 1}, "body"),
                ({"tenant": "acme", "metric": "Bad Name"}, "metric"),
            ):
                r = await _post(addr, "cooldown", bad, headers=token)
                assert r.status_code == 400 and r.json()["error"].startswith(field), r.json()
            assert (await _post(addr, "admit", ONE)).json()["allowed"] is True
            r = await _post(addr, "cooldown", {**ONE, "cooldown_s": 30}, headers=token)
            assert (r.status_code, r.json()) == (200, {"ok": True})
            v = (await _post(addr, "admit", ONE)).json()
            assert v["allowed"] is False and v["suspended"] == "cooldown"
            assert 0 < v["retry_after_ms"] <= 30_000

    asyncio.run(main())

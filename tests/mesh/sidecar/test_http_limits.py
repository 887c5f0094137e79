"""The HTTP conventions callers bring from Envoy's ratelimit, the `limits` package,
Gubernator and redis-cell, through a real node's sidecar on loopback: a denial as 429 with
Retry-After when asked, the RateLimit-Policy and RateLimit fields, the exact limit beside
the rounded `limit`, a peek (amount 0) that charges nothing, and a metric name no policy
uses refused as the typo it likely is."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from mesh.config import parse_config
from mesh.errors import ConfigError
from mesh.sidecar import admission_pb2 as pb
from tests.mesh.sidecar._node import BYTES, LIMIT, admit_call, insecure, item, node, node_config

ONE = {"tenant": "acme", "metric": "read_iops"}
ASK_429 = {"x-ratemesh-deny-status": "429"}
# 100 a day: `limit` (units per second, rounded down) is 0; the exact rate is not
DAILY: dict[str, Any] = dict(
    LIMIT, metric="write_iops", target_rate="100/day", global_burst=3, local_burst_cap=3
)
# a metric of the operator's own naming, with a policy for another tenant only
TOKENS: dict[str, Any] = dict(LIMIT, tenant_id="beta", metric="tokens", global_burst=100,
                              local_burst_cap=100)  # fmt: skip


def _config(**sidecar: Any) -> dict[str, Any]:
    cfg = node_config({"http_listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0", **sidecar})
    cfg["policies"]["inline"] += [DAILY, TOKENS, dict(LIMIT, tenant_id="gamma", mode="redis")]
    return cfg


async def _admit(addr: str, body: Any, route: str = "admit", **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as c:
        return await c.post(f"http://{addr}/v1/{route}", json=body, headers=headers)


def test_a_denial_is_200_unless_asked_then_429_with_retry_after() -> None:
    async def main() -> None:
        async with node(_config()) as mesh:
            addr = mesh.sidecar_addresses["http"]
            r = await _admit(addr, dict(ONE, amount=5))  # the whole burst
            assert r.status_code == 200 and r.json()["allowed"] is True
            assert "retry-after" not in r.headers
            r = await _admit(addr, ONE)
            assert r.status_code == 200 and r.json()["allowed"] is False  # as before
            assert "retry-after" not in r.headers
            r = await _admit(addr, ONE, **ASK_429)
            assert r.status_code == 429 and r.json()["reason"] == "rate_limited"
            retry_ms = r.json()["retry_after_ms"]
            assert 0 < retry_ms <= 1000  # one unit a second
            assert r.headers["retry-after"] == str(-(-retry_ms // 1000)) == "1"
            # the RateLimit field's reset is the same moment as Retry-After (never earlier)
            assert r.headers["ratelimit"] == '"read_iops";r=0;t=1'
            # waiting cannot help a tenant without a policy: 429, but no time promised
            r = await _admit(addr, {"tenant": "nobody", "metric": "read_iops"}, **ASK_429)
            assert (r.status_code, r.json()["reason"]) == (429, "policy_unknown")
            assert "retry-after" not in r.headers and "ratelimit" not in r.headers
            # a batch is always 200: each item's verdict says what happened to it
            r = await _admit(addr, {"items": [ONE]}, **ASK_429)
            assert r.status_code == 200 and r.json()["verdicts"][0]["allowed"] is False
            r = await _admit(addr, ONE, **{"x-ratemesh-deny-status": "418"})
            assert r.status_code == 400
            assert r.json()["error"] == "x-ratemesh-deny-status: must be 200 or 429, got '418'"

    asyncio.run(main())


def test_the_node_can_answer_every_denial_429_and_a_request_can_ask_for_200() -> None:
    async def main() -> None:
        async with node(_config(http_status_on_deny=429)) as mesh:
            addr = mesh.sidecar_addresses["http"]
            r = await _admit(addr, dict(ONE, amount=6))  # over the burst: waiting cannot help
            assert (r.status_code, r.json()["reason"]) == (429, "too_large")
            assert "retry-after" not in r.headers
            await _admit(addr, dict(ONE, amount=5))
            r = await _admit(addr, ONE, route="charge")
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            r = await _admit(addr, ONE, **{"x-ratemesh-deny-status": "200"})
            assert r.status_code == 200 and r.json()["allowed"] is False

    asyncio.run(main())


def test_http_status_on_deny_takes_200_or_429_only() -> None:
    parse_config(_config(http_status_on_deny=200))
    for bad in (418, "429", True):
        with pytest.raises(ConfigError) as info:
            parse_config(_config(http_status_on_deny=bad))
        assert info.value.field == "sidecar.http_status_on_deny"


def test_every_verdict_carries_the_ratelimit_fields_and_the_exact_limit() -> None:
    async def main() -> None:
        async with node(_config()) as mesh:
            addr = mesh.sidecar_addresses["http"]
            r = await _admit(addr, ONE)
            body = r.json()
            assert (body["limit"], body["rate"], body["burst"]) == (1, "1/second", 5)
            assert body["window"] == {"amount": 1, "period_s": 1}
            assert r.headers["ratelimit-policy"] == '"read_iops";q=1;w=1;ratemesh-burst=5'
            reset_s = -(-body["reset_after_ms"] // 1000)
            assert r.headers["ratelimit"] == f'"read_iops";r=4;t={reset_s}'
            # 100 a day: `limit` stays rounded down per second, the exact rate beside it
            r = await _admit(addr, {"tenant": "acme", "metric": "write_iops"})
            body = r.json()
            assert (body["limit"], body["rate"], body["burst"]) == (0, "100/day", 3)
            assert body["window"] == {"amount": 100, "period_s": 86400}
            assert r.headers["ratelimit-policy"] == '"write_iops";q=100;w=86400;ratemesh-burst=3'
            assert r.headers["ratelimit"].startswith('"write_iops";r=2;t=')
            # bytes are the draft's content-bytes; a batch's verdicts carry the exact limit
            egress = {"tenant": "acme", "metric": "client_egress_bytes", "amount": 10}
            r = await _admit(addr, egress, route="charge")
            assert r.headers["ratelimit-policy"] == (
                '"client_egress_bytes";q=1;qu="content-bytes";w=1;ratemesh-burst=1000'
            )
            r = await _admit(addr, {"items": [egress, ONE]})
            assert [(v["rate"], v["burst"]) for v in r.json()["verdicts"]] == [
                ("1/second", BYTES["global_burst"]),
                ("1/second", 5),
            ]
            assert "ratelimit" not in r.headers  # many verdicts: the JSON says each one

    asyncio.run(main())


def test_amount_zero_peeks_and_charges_nothing() -> None:
    async def main() -> None:
        async with node(_config()) as mesh:
            addr = mesh.sidecar_addresses["http"]
            peek = dict(ONE, amount=0)
            # a limit not used yet here: a full view, nothing charged
            r = await _admit(addr, peek)
            assert (r.json()["allowed"], r.json()["remaining"]) == (True, 5)
            assert r.headers["ratelimit"] == '"read_iops";r=5;t=0'
            for _ in range(3):
                r = await _admit(addr, peek)
                assert r.json()["remaining"] == 5
            r = await _admit(addr, dict(ONE, amount=2))
            assert r.json()["remaining"] == 3
            r = await _admit(addr, peek)
            assert (r.json()["allowed"], r.json()["remaining"]) == (True, 3)
            # in a batch a peek sees what came before it, and nothing after
            r = await _admit(addr, {"items": [peek, dict(ONE, amount=3), peek, ONE]})
            got = [(v["allowed"], v["remaining"]) for v in r.json()["verdicts"]]
            assert got == [(True, 3), (True, 0), (False, 0), (False, 0)]
            peeked = r.json()["verdicts"][2]
            assert peeked["reason"] == "rate_limited" and peeked["retry_after_ms"] > 0
            # a peek of a tenant without a policy is policy_unknown, as an admission is
            r = await _admit(addr, {"tenant": "nobody", "metric": "read_iops", "amount": 0})
            assert r.json()["reason"] == "policy_unknown"
            # a redis-mode limit's state is in Redis: a peek there is refused, naming why
            r = await _admit(addr, {"tenant": "gamma", "metric": "read_iops", "amount": 0})
            assert r.status_code == 400
            assert r.json()["error"].startswith("amount: 0 (a peek) is not served for read_iops")
            # over gRPC: an amount of 0, sent (proto3 optional), is the same peek
            async with insecure(mesh.sidecar_addresses["grpc"]) as ch:
                resp = await admit_call(ch)(pb.AdmitRequest(items=[item(amount=0)]))
                (v,) = resp.verdicts
                assert not v.HasField("error") and v.reason == "rate_limited"
                assert v.remaining == 0 and v.retry_after_ms > 0

    asyncio.run(main())


def test_a_metric_no_policy_names_is_refused_naming_it() -> None:
    async def main() -> None:
        async with node(_config()) as mesh:
            addr = mesh.sidecar_addresses["http"]
            r = await _admit(addr, {"tenant": "acme", "metric": "read_lops"})
            assert r.status_code == 400
            assert r.json()["error"].startswith(
                "metric: unknown metric 'read_lops': no policy of any tenant names it here"
            )
            r = await _admit(addr, {"tenant": "acme", "metric": "read_lops", "amount": 0})
            assert r.status_code == 400
            r = await _admit(addr, {"items": [{"tenant": "acme", "metric": "read_lops"}, ONE]})
            typo, good = r.json()["verdicts"]
            assert typo["error"].startswith("metric: unknown metric 'read_lops'")
            assert good["allowed"] is True
            # a well-known name, and a name another tenant's policy uses: real metrics with
            # no policy for this tenant yet, answered policy_unknown as before
            for metric in ("origin_write_bytes", "tokens"):
                r = await _admit(addr, {"tenant": "acme", "metric": metric})
                assert (r.status_code, r.json()["reason"]) == (200, "policy_unknown")

    asyncio.run(main())

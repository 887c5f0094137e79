"""Hostile input through real sockets: random bytes as a gRPC Admit, random JSON and
non-JSON as HTTP bodies. Every answer is a clear refusal or a decision, never an internal
error, and the limit nobody asked for legitimately keeps its whole burst."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import grpc
import httpx

from mesh.sidecar import admission_pb2 as pb
from tests.mesh.sidecar._node import admit_call, insecure, item, node, node_config

SEED = 20261202


def _junk_json(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(8 if depth < 3 else 5)
    if pick == 0:
        return rng.choice([None, True, False])
    if pick == 1:
        return rng.choice([0, -1, 1, 2**63, -(2**70), 1.5, 1e308])
    if pick == 2:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(0, 12)))
    if pick == 3:
        return rng.choice(["acne", "read_iops", "", "items", "tenant"])  # never acme
    if pick == 4:
        return rng.choice([{}, [], {"tenant": "zz", "metric": "read_iops"}])
    if pick == 5:
        return [_junk_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["tenant", "metric", "amount", "descriptors", "items", "x"]
    return {rng.choice(keys): _junk_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_random_input_is_refused_or_decided_and_never_breaks_the_node() -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)

    async def main() -> None:
        async with node(node_config()) as mesh:
            g, h = mesh.sidecar_addresses["grpc"], mesh.sidecar_addresses["http"]
            async with insecure(g) as ch, httpx.AsyncClient(timeout=5) as c:
                admit = admit_call(ch)
                for _ in range(120):
                    data = rng.randbytes(rng.randrange(1, 64))
                    try:
                        resp = await admit(data)
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, exc
                    else:  # bytes that happen to decode: their items are answered
                        assert all(not v.allowed or v.reason for v in resp.verdicts)
                for _ in range(120):
                    doc = _junk_json(rng)
                    body = json.dumps(doc).encode() if rng.random() < 0.8 else rng.randbytes(20)
                    r = await c.post(f"http://{h}/v1/admit", content=body)
                    assert r.status_code in (200, 400), (doc, r.status_code, r.text)
                    answer = r.json()
                    assert ("error" in answer) == (r.status_code == 400), answer
                # none of it was acme's read_iops: its whole burst of 5 is still there
                resp = await admit(pb.AdmitRequest(items=[item() for _ in range(6)]))
                assert [v.allowed for v in resp.verdicts] == [True] * 5 + [False]

    asyncio.run(main())

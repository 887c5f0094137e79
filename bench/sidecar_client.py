"""One client process of `mesh bench sidecar`: batched gRPC Admit calls, the same batches
over AdmitStream, then HTTP/1.1
keep-alive POST /v1/admit requests, against a `mesh node` on this host.

    python -m bench.sidecar_client --grpc ADDR --http ADDR --seconds S --batch B \
        --streams N --connections C

It prints one JSON line: calls, admissions, allowed and latencies (us, per call / request)
for each front end. The HTTP client is a bare asyncio HTTP/1.1 client (one request in
flight per connection, Content-Length framing) so that the client's own cost stays small
beside the server's: httpx spends more per request than uvicorn does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import grpc

from mesh.sidecar import admission_pb2 as pb
from ratemesh.checks import address_parts

__all__ = ["main", "TENANT"]

TENANT = "bench"
METRIC = "read_iops"
SAMPLES_MAX = 200_000  # latencies kept per front end (every k-th past it)


async def _grpc(
    addr: str, seconds: float, batch: int, streams: int, *, stream: bool = False
) -> dict[str, Any]:
    """`streams` loops of batched calls for `seconds`: unary Admit calls, or (`stream`) one
    AdmitStream each, a request written and its response read in turn."""
    req = pb.AdmitRequest(
        items=[pb.AdmitItem(tenant=TENANT, metric=METRIC) for _ in range(batch)]
    ).SerializeToString()
    channel = grpc.aio.insecure_channel(addr)
    call = channel.unary_unary(
        "/ratemesh.sidecar.v1.Admission/Admit",
        request_serializer=None,
        response_deserializer=None,  # bytes: counted below
    )
    seen: dict[bytes, tuple[int, int]] = {}  # a response's bytes -> (verdicts, allowed)

    def count(data: bytes) -> tuple[int, int]:
        """Exact counts, decoded once per distinct response (here nearly all are alike):
        the client's cost shares the host with the server's."""
        hit = seen.get(data)
        if hit is None:
            verdicts = pb.AdmitResponse.FromString(data).verdicts
            hit = (len(verdicts), sum([v.allowed for v in verdicts]))
            if len(seen) < 64:
                seen[data] = hit
        return hit

    await call(req)  # connected and warm
    lat_us: list[float] = []
    counts = {"calls": 0, "admissions": 0, "allowed": 0, "errors": 0}
    end = time.perf_counter() + seconds

    def record(t0: float, data: bytes) -> None:
        lat_us.append((time.perf_counter() - t0) * 1e6)
        n, allowed = count(data)
        counts["calls"] += 1
        counts["admissions"] += n
        counts["allowed"] += allowed
        counts["errors"] += n - allowed  # none is denied: the limit is too large to reach

    async def loop() -> None:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            record(t0, await call(req))

    open_stream = channel.stream_stream(
        "/ratemesh.sidecar.v1.Admission/AdmitStream",
        request_serializer=None,
        response_deserializer=None,
    )

    async def stream_loop() -> None:
        s = open_stream()
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await s.write(req)
            data = await s.read()
            assert isinstance(data, bytes), "the stream ended early"
            record(t0, data)
        await s.done_writing()
        await s.code()  # the stream's status: OK once the server answered every request

    t0 = time.perf_counter()
    await asyncio.gather(*((stream_loop if stream else loop)() for _ in range(streams)))
    elapsed = time.perf_counter() - t0
    await channel.close()
    return {**counts, "elapsed_s": elapsed, "latencies_us": _thin(lat_us)}


async def _http(addr: str, seconds: float, connections: int) -> dict[str, Any]:
    host, port = address_parts("addr", addr)
    body = json.dumps({"tenant": TENANT, "metric": METRIC}).encode()
    request = (
        f"POST /v1/admit HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    lat_us: list[float] = []
    counts = {"requests": 0, "allowed": 0, "errors": 0}
    end = time.perf_counter() + seconds

    async def conn() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                data = await reader.readexactly(length)
                lat_us.append((time.perf_counter() - t0) * 1e6)
                counts["requests"] += 1
                if not head.startswith(b"HTTP/1.1 200"):
                    counts["errors"] += 1
                elif b'"allowed": true' in data:
                    counts["allowed"] += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(conn() for _ in range(connections)))
    elapsed = time.perf_counter() - t0
    return {**counts, "elapsed_s": elapsed, "latencies_us": _thin(lat_us)}


def _thin(xs: list[float]) -> list[float]:
    if len(xs) <= SAMPLES_MAX:
        return [round(x, 1) for x in xs]
    step = len(xs) / SAMPLES_MAX
    return [round(xs[int(i * step)], 1) for i in range(SAMPLES_MAX)]


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.grpc:
        out["grpc_unary"] = await _grpc(args.grpc, args.seconds, args.batch, args.streams)
        out["grpc"] = await _grpc(args.grpc, args.seconds, args.batch, args.streams, stream=True)
    if args.http:
        out["http"] = await _http(args.http, args.seconds, args.connections)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="bench.sidecar_client")
    p.add_argument("--grpc", default="")
    p.add_argument("--http", default="")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--connections", type=int, default=8)
    args = p.parse_args()
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(_main(args))
    else:
        result = uvloop.run(_main(args))
    from bench._procs import print_result

    print_result(result)


if __name__ == "__main__":
    main()

"""`mesh bench sidecar`: the sidecar admission API of a real `mesh node`, driven by client
processes on the same host (DESIGN.md section 5).

The node is one `mesh node` process (its own member, static membership of one) with a
`local`-mode limit too large to deny, so the figures are the sidecar's cost (decode, the
hot path, encode, the transport), not a limit's. Each run starts `clients` client processes
(`bench.sidecar_client`) at once: each drives `streams` concurrent batched gRPC Admit calls
of `batch` items for `seconds`, then as many AdmitStream streams of the same batches, then
`connections` HTTP/1.1 keep-alive connections each sending POST /v1/admit (one item) back
to back for `seconds`.

Keys: grpc_admits_per_s (admissions, i.e. items, per second over all clients, batches of
`batch` over AdmitStream: one long-lived stream per in-flight batch, the transport for a
worker that batches), grpc_calls_per_s, grpc_p99_us / grpc_p50_us (per batch of `batch`
items), grpc_unary_admits_per_s and grpc_unary_p99_us (the same batches as unary Admit
calls, a call each: grpcio's cost per call is most of a call of 100),
http_requests_per_s, http_p99_us / http_p50_us (per request), each the median over `runs`
(and `per_run`), plus runs, batch, clients, streams, connections, seconds, and the counts:
grpc_admissions, http_requests (over all runs), admitted_at_node (the node's
ratemesh_admitted, from /metrics: the bench's is the only tenant) and counts_match (every
admission the clients saw allowed is one the node counted).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench._procs import free_port, read_ready, spawn, stop, write_config
from bench.sidecar_client import METRIC, TENANT
from ratemesh.envelope import percentile

__all__ = ["run", "CLIENTS_MAX"]

CLIENTS_MAX = 16
HUGE = 10**15  # a limit no run reaches: every admission is allowed
TARGET_GRPC_ADMITS_PER_S = 100_000  # the target the sidecar is built for
TARGET_HTTP_REQUESTS_PER_S = 5_000


def _config(tmp: Path) -> Path:
    peer = f"127.0.0.1:{free_port()}"
    return write_config(
        tmp / "sidecar.yaml",
        {
            "member_id": "sidecar",
            "listen": peer,
            "membership": {"source": "static", "members": {"sidecar": peer}},
            "policies": {
                "inline": [
                    {
                        "tenant_id": TENANT,
                        "metric": METRIC,
                        "generation": 1,
                        "mode": "local",
                        "target_rate": HUGE,
                        "global_burst": HUGE,
                        "local_burst_cap": HUGE,
                    }
                ]
            },
            "sidecar": {"grpc_listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0"},
            "shutdown_drain_ms": 300,
        },
    )


def _p(xs: list[float], q: float) -> float:
    return percentile(xs, q) if xs else 0.0


def _admitted_at_node(http: str) -> int:
    text = httpx.get(f"http://{http}/metrics", timeout=5).text
    total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == "ratemesh_admitted":
            # every tenant label: the bench's one tenant may be under "other" (top-K)
            total += sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return int(total)


def _one_run(
    grpc: str, http: str, *, clients: int, seconds: float, batch: int, streams: int, conns: int
) -> dict[str, Any]:
    args = [
        "-m", "bench.sidecar_client", "--grpc", grpc, "--http", http,
        "--seconds", str(seconds), "--batch", str(batch),
        "--streams", str(streams), "--connections", str(conns),
    ]  # fmt: skip
    procs = [spawn(args) for _ in range(clients)]
    try:
        results = [read_ready(p, timeout_s=60 + 4 * seconds) for p in procs]
    finally:
        for p in procs:
            stop(p)
    g = [r["grpc"] for r in results]
    u = [r["grpc_unary"] for r in results]
    h = [r["http"] for r in results]
    u_lat = [x for r in u for x in r["latencies_us"]]
    u_s = max(r["elapsed_s"] for r in u)
    g_lat = [x for r in g for x in r["latencies_us"]]
    h_lat = [x for r in h for x in r["latencies_us"]]
    g_s = max(r["elapsed_s"] for r in g)
    h_s = max(r["elapsed_s"] for r in h)
    return {
        "grpc_admits_per_s": round(sum(r["admissions"] for r in g) / g_s),
        "grpc_calls_per_s": round(sum(r["calls"] for r in g) / g_s),
        "grpc_p50_us": round(_p(g_lat, 0.50), 1),
        "grpc_p99_us": round(_p(g_lat, 0.99), 1),
        "grpc_unary_admits_per_s": round(sum(r["admissions"] for r in u) / u_s),
        "grpc_unary_p99_us": round(_p(u_lat, 0.99), 1),
        "http_requests_per_s": round(sum(r["requests"] for r in h) / h_s),
        "http_p50_us": round(_p(h_lat, 0.50), 1),
        "http_p99_us": round(_p(h_lat, 0.99), 1),
        "grpc_calls": sum(r["calls"] for r in g) + sum(r["calls"] for r in u),
        "grpc_admissions": sum(r["admissions"] for r in g) + sum(r["admissions"] for r in u),
        "grpc_allowed": sum(r["allowed"] for r in g) + sum(r["allowed"] for r in u),
        "grpc_errors": sum(r["errors"] for r in g) + sum(r["errors"] for r in u),
        "http_requests": sum(r["requests"] for r in h),
        "http_allowed": sum(r["allowed"] for r in h),
        "http_errors": sum(r["errors"] for r in h),
    }


def run(
    *,
    runs: int = 3,
    seconds: float = 3.0,
    batch: int = 100,
    clients: int = 1,
    streams: int = 8,
    connections: int = 8,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        node = spawn(["-m", "mesh.cli", "node", "--config", str(_config(Path(tmp)))])
        try:
            ready = read_ready(node)
            grpc, http = ready["sidecar"]["grpc"], ready["sidecar"]["http"]
            per_run = [
                _one_run(
                    grpc,
                    http,
                    clients=clients,
                    seconds=seconds,
                    batch=batch,
                    streams=streams,
                    conns=connections,
                )
                for _ in range(runs)
            ]
            admitted = _admitted_at_node(http)
        finally:
            stop(node)
            if node.returncode not in (0, None):
                print(f"bench sidecar: the node exited {node.returncode}", file=sys.stderr)
    out: dict[str, Any] = {
        "runs": runs,
        "seconds": seconds,
        "batch": batch,
        "clients": clients,
        "streams": streams,
        "connections": connections,
        "mode": "local",
    }
    for key in (
        "grpc_admits_per_s",
        "grpc_calls_per_s",
        "grpc_p50_us",
        "grpc_p99_us",
        "grpc_unary_admits_per_s",
        "grpc_unary_p99_us",
        "http_requests_per_s",
        "http_p50_us",
        "http_p99_us",
    ):
        out[key] = percentile([r[key] for r in per_run], 0.50)
    for key in (
        "grpc_calls",
        "grpc_admissions",
        "grpc_allowed",
        "grpc_errors",
        "http_requests",
        "http_allowed",
        "http_errors",
    ):
        out[key] = sum(r[key] for r in per_run)
    out["admitted_at_node"] = admitted
    # The clients' warm-up calls (one batch before the unary and one before the stream
    # phase, each client and run) are admitted too.
    warmup = 2 * runs * clients * batch
    out["counts_match"] = admitted == out["grpc_allowed"] + out["http_allowed"] + warmup
    out["target_grpc_admits_per_s"] = TARGET_GRPC_ADMITS_PER_S
    out["target_http_requests_per_s"] = TARGET_HTTP_REQUESTS_PER_S
    out["within_target"] = (
        out["grpc_admits_per_s"] >= TARGET_GRPC_ADMITS_PER_S
        and out["http_requests_per_s"] >= TARGET_HTTP_REQUESTS_PER_S
    )
    out["per_run"] = [
        {
            k: r[k]
            for k in (
                "grpc_admits_per_s",
                "grpc_p99_us",
                "grpc_unary_admits_per_s",
                "http_requests_per_s",
                "http_p99_us",
            )
        }
        for r in per_run
    ]
    return out

"""The sidecar admission API of `mesh node` (docs/sidecar.md): workers in any language ask
their local node for admission over gRPC (`ratemesh.sidecar.v1.Admission`, admission.proto:
Admit / Charge / Refund, many items a call) or HTTP/JSON (`POST /v1/admit|charge|refund`),
and the node's /metrics and /health are served by the same HTTP server (uvicorn).

`Sidecar` is what the node starts beside its peer port: the gRPC server at
`sidecar.grpc_listen`, the HTTP server at `sidecar.http_listen` (every route), and one at
`telemetry_listen` (/metrics and /health only) unless that is the same address.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mesh.config import NodeConfig, is_loopback
from mesh.sidecar._auth import AUTH_HEADER, BearerCheck
from mesh.sidecar._envoy import RLS_SERVICE, EnvoyRls
from mesh.sidecar._grpc import ADMISSION_SERVICE, GrpcSidecar, encode_outcomes
from mesh.sidecar._http import Access, HttpApp, HttpServer
from mesh.sidecar._items import (
    DESCRIPTORS_MAX,
    NAME_MAX_CHARS,
    Admitter,
    Decider,
    Item,
    Outcome,
    verdict_fields,
)
from mesh.telemetry import Route

__all__ = [
    "ADMISSION_SERVICE",
    "AUTH_HEADER",
    "RLS_SERVICE",
    "DESCRIPTORS_MAX",
    "NAME_MAX_CHARS",
    "Admitter",
    "BearerCheck",
    "Decider",
    "EnvoyRls",
    "GrpcSidecar",
    "HttpApp",
    "HttpServer",
    "Item",
    "Outcome",
    "Sidecar",
    "encode_outcomes",
    "verdict_fields",
]


class Sidecar:
    """The node's servers beside its peer port. Each is started (and, on a failure, what
    was started is stopped again) in order: gRPC, HTTP, telemetry."""

    def __init__(
        self,
        admitter: Admitter,
        cfg: NodeConfig,
        routes: Mapping[str, Route],
        *,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.cfg = cfg
        self.ready = ready  # gRPC health: NOT_SERVING until the node has policies
        self.routes = routes
        self.decider = Decider(admitter)
        envoy, items_max = cfg.envoy_rls, cfg.sidecar.items_max
        self.envoy = None if envoy is None else EnvoyRls(envoy, admitter, descriptors_max=items_max)
        sc = cfg.sidecar
        self.access = Access(sc.operator_tokens, sc.tenant_tokens, sc.cooldown_max_s)
        self.grpc: GrpcSidecar | None = None
        self.http: HttpServer | None = None
        self.telemetry: HttpServer | None = None
        self.grpc_address = ""
        self.http_address = ""
        self.telemetry_address = ""

    @property
    def addresses(self) -> dict[str, str]:
        """{"grpc": address, "http": address} for the front ends that are on."""
        out = {"grpc": self.grpc_address, "http": self.http_address}
        return {k: v for k, v in out.items() if v}

    async def start(self) -> None:
        cfg, sc = self.cfg, self.cfg.sidecar
        drain_s = cfg.shutdown_drain_ms / 1000
        try:
            if sc.grpc_listen:
                self.grpc = GrpcSidecar(
                    self.decider,
                    sc,
                    tls=cfg.tls,
                    fleet_secrets=_tokens(cfg),
                    envoy=self.envoy,
                    ready=self.ready,
                )
                self.grpc_address = await self.grpc.start()
            if sc.http_listen:
                needs = sc.needs_auth(sc.http_listen) and bool(_tokens(cfg))
                app = HttpApp(
                    self.routes,
                    self.decider,
                    items_max=sc.items_max,
                    body_max_bytes=sc.max_message_bytes,
                    auth=BearerCheck(_tokens(cfg), required=needs),
                    access=self.access,
                    status_on_deny=sc.http_status_on_deny,
                )
                tls = cfg.tls if cfg.tls is not None and not is_loopback(sc.http_listen) else None
                self.http = HttpServer(
                    app,
                    sc.http_listen,
                    field="sidecar.http_listen",
                    concurrent_max=sc.concurrent_max,
                    peer_connections_max=sc.peer_connections_max,
                    tls=tls,
                    drain_s=drain_s,
                )
                self.http_address = await self.http.start()
            if cfg.telemetry_listen and _same(cfg.telemetry_listen, sc.http_listen):
                self.telemetry_address = self.http_address
            elif cfg.telemetry_listen:
                self.telemetry = HttpServer(
                    HttpApp(self.routes, access=self.access),
                    cfg.telemetry_listen,
                    field="telemetry_listen",
                    concurrent_max=sc.concurrent_max,
                    peer_connections_max=sc.peer_connections_max,
                    drain_s=drain_s,
                )
                self.telemetry_address = await self.telemetry.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop accepting everywhere, drain each with the node's shutdown bound."""
        grace_s = self.cfg.shutdown_drain_ms / 1000
        if self.grpc is not None:
            await self.grpc.stop(grace_s)
            self.grpc = None
        for server in (self.http, self.telemetry):
            if server is not None:
                await server.stop()
        self.http = self.telemetry = None


def _tokens(cfg: NodeConfig) -> tuple[bytes, ...]:
    """The bearer tokens callers may send: the sidecar's own, else the fleet secrets."""
    return cfg.sidecar.tokens or cfg.fleet_secrets_accepted


def _same(a: str, b: str | None) -> bool:
    """One server for both: the same address with a fixed port (port 0 twice is two
    servers, each on a port of its own)."""
    return a == b and not a.endswith(":0")

"""governord, the process: open the record, apply the config, serve, drain, stop.

Shutdown is a designed phase: on SIGTERM/SIGINT stop taking new calls, let running ones finish
for ``drain_s``, then cancel the rest and close the record. A failed commit stops the process
at once with status 70 (the log's ``on_fatal``): serving from memory that is ahead of the record
would hand out answers that can un-happen. SIGHUP re-reads the TLS certificate and key; new
connections use them, no restart needed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc import aio
from prometheus_client import start_http_server

from governor.authority import Authority
from governor.config import GovernordConfig, TlsFiles, is_loopback
from governor.store import EventLog, MemoryBackend, PostgresBackend, SqliteBackend

from ._metrics import Metrics
from ._reconcile import apply_config
from ._service import GovernorService

__all__ = ["CertReloader", "serve", "run"]

MESSAGE_BYTES_MAX = 1 << 20


def _say(text: str) -> None:
    print(f"governord: {text}", file=sys.stderr, flush=True)


class CertReloader:
    """Dynamic server credentials: the fetcher hands gRPC new files after a SIGHUP."""

    def __init__(self, tls: TlsFiles) -> None:
        self.tls = tls
        self._want = threading.Event()
        self.reloads = 0

    def _config(self) -> grpc.ServerCertificateConfiguration:
        key = Path(self.tls.key).read_bytes()
        cert = Path(self.tls.cert).read_bytes()
        return grpc.ssl_server_certificate_configuration([(key, cert)])

    def request(self) -> None:
        self._want.set()

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        if not self._want.is_set():
            return None
        self._want.clear()
        try:
            config = self._config()
        except OSError as exc:
            _say(f"certificate reload failed, keeping the old one: {exc}")
            return None
        self.reloads += 1
        _say("certificate reloaded")
        return config

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._config(), self._fetch, require_client_authentication=False
        )


def _open_log(cfg: GovernordConfig) -> EventLog:
    kind, target = cfg.store_kind()
    if kind == "sqlite":
        return EventLog(SqliteBackend(target))
    if kind == "memory":
        _say("store memory: NOT durable (benchmarks only)")
        return EventLog(MemoryBackend())
    schema = os.environ.get("GOVERNOR_PG_SCHEMA", "governor")
    app = os.environ.get("GOVERNOR_PG_APP_NAME", "governord")
    return EventLog(PostgresBackend(target, schema=schema, application_name=app))


async def serve(
    cfg: GovernordConfig, *, on_listening: Callable[[list[str]], None] | None = None
) -> int:
    if cfg.tls is None and not cfg.allow_plaintext:
        bad = [a for a in cfg.listen if not is_loopback(a)]
        if bad:
            _say(f"refusing to serve {bad[0]} without TLS (set allow_plaintext: true to allow)")
            return 2
    loop = asyncio.get_running_loop()
    log = _open_log(cfg)
    authority = Authority(log, snapshot_every=cfg.snapshot_every)
    tenants = apply_config(authority, cfg)
    metrics = Metrics()
    metrics.attach(authority)
    service = GovernorService(authority, cfg, tenants, metrics, loop)
    authority.start_reaper(0.02)
    server = aio.server(
        options=[
            ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
            ("grpc.so_reuseport", 0),
        ]
    )
    server.add_generic_rpc_handlers((service.handler(),))
    reloader = CertReloader(cfg.tls) if cfg.tls is not None else None
    bound = []
    for addr in cfg.listen:
        if reloader is not None:
            port = server.add_secure_port(addr, reloader.credentials())
        else:
            port = server.add_insecure_port(addr)
        bound.append(f"{addr.rpartition(':')[0]}:{port}")
    if cfg.metrics:
        host, _, port_s = cfg.metrics.rpartition(":")
        start_http_server(int(port_s), addr=host.strip("[]"), registry=metrics.registry)
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if reloader is not None:
        loop.add_signal_handler(signal.SIGHUP, reloader.request)
    else:
        loop.add_signal_handler(signal.SIGHUP, lambda: _say("SIGHUP: no TLS, nothing to reload"))
    kind, target = cfg.store_kind()
    where = target if kind == "sqlite" else "postgresql"
    _say(
        f"listening on {', '.join(bound)} ({'TLS' if reloader else 'plaintext'}), "
        f"store {kind} {where}, {len(cfg.tenants)} tenant(s)"
        + (f", metrics on {cfg.metrics}" if cfg.metrics else "")
    )
    print(f"LISTENING {' '.join(bound)}", flush=True)
    if on_listening is not None:
        on_listening(bound)
    await stop.wait()
    _say(f"stopping: draining for up to {cfg.drain_s} s")
    service.draining = True
    await server.stop(cfg.drain_s)
    authority.close()
    _say("stopped")
    return 0


def run(cfg: GovernordConfig) -> int:
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(serve(cfg))

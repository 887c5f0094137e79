"""governord, the process: open the record, apply the config, serve, drain, stop.

Shutdown is a designed phase: on SIGTERM/SIGINT stop taking new calls, let running ones finish
for ``drain_s``, then cancel the rest and close the record. A failed commit stops the process
at once with status 70 (the log's ``on_fatal``): serving from memory that is ahead of the record
would hand out answers that can un-happen. SIGHUP re-reads the TLS certificate and key; new
connections use them, no restart needed.

Starting is where the operator's settings meet the machine: a store that cannot be opened,
reached or trusted, an address that cannot be bound, a certificate that cannot be read. Each
is translated here into a ``ConfigError`` naming the setting (``store``, ``listen``,
``metrics``, ``tls``), which ``governord`` prints as one line, exit status 2; whatever was
already started is closed first.
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

from governor.authority import Authority
from governor.config import ConfigError, GovernordConfig, TlsFiles, is_loopback
from governor.engine import RecordError
from governor.store import EventLog, MemoryBackend, PostgresBackend, SqliteBackend, StoreError
from ratemesh.coordinator import PING_INTERVAL_MIN_MS
from ratemesh.operator import one_line, probe_bind

from ._bootstrap import import_bootstrap
from ._coordinator import CoordinatorService
from ._metrics import Metrics
from ._reconcile import apply_config
from ._service import GovernorService
from ._ui import serve_metrics_and_ui

__all__ = ["CertReloader", "serve", "run"]

MESSAGE_BYTES_MAX = 1 << 20
# Clients that keep idle connections alive (a mesh node's policy watch pings every
# ratemesh.coordinator.KEEPALIVE_MS) are not sent GOAWAY `too_many_pings`, which gRPC's
# default (one ping in 5 min) answered at the third ping, ending every idle watch.
KEEPALIVE_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", PING_INTERVAL_MIN_MS),
)


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


def _open_authority(cfg: GovernordConfig) -> Authority:
    """The record opened and loaded. A database that cannot be opened, reached or migrated,
    or a record that cannot be trusted, is the ``store`` setting for the operator to fix."""
    try:
        log = _open_log(cfg)
    except StoreError as exc:  # its message names the database: the path, or host and port
        raise ConfigError("store", one_line(exc)) from exc
    try:
        return Authority(log, snapshot_every=cfg.snapshot_every)
    except (StoreError, RecordError) as exc:
        log.close()
        raise ConfigError("store", f"cannot load the record: {one_line(exc)}") from exc


def _bind(server: aio.Server, addr: str, reloader: CertReloader | None) -> str:
    """Bind ``addr``; the bound ``host:port`` (port 0 asks for a free one)."""
    probe_bind(addr, error=ConfigError)
    try:
        if reloader is not None:
            port = server.add_secure_port(addr, reloader.credentials())
        else:
            port = server.add_insecure_port(addr)
    except OSError as exc:  # the certificate or key file
        raise ConfigError("tls", f"cannot read {exc.filename}: {exc.strerror}") from exc
    except RuntimeError as exc:  # grpc's "Failed to bind to address ...": the probe lost a race
        raise ConfigError(
            "listen", f"cannot bind {addr}: the port is in use or the address is not this host's"
        ) from exc
    return f"{addr.rpartition(':')[0]}:{port}"


def _serve_metrics(address: str, metrics: Metrics, authority: Authority) -> None:
    host, _, port_s = address.rpartition(":")
    try:  # /metrics, and the live page /ui (governor/server/_ui.py)
        serve_metrics_and_ui(host.strip("[]"), int(port_s), metrics.registry, authority)
    except OSError as exc:
        raise ConfigError("metrics", f"cannot serve on {address}: {exc.strerror}") from exc


async def serve(
    cfg: GovernordConfig, *, on_listening: Callable[[list[str]], None] | None = None
) -> int:
    if cfg.tls is None and not cfg.allow_plaintext:
        bad = [a for a in cfg.listen if not is_loopback(a)]
        if bad:
            _say(f"refusing to serve {bad[0]} without TLS (set allow_plaintext: true to allow)")
            return 2
    loop = asyncio.get_running_loop()
    authority = _open_authority(cfg)
    server = aio.server(
        options=[
            ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
            ("grpc.so_reuseport", 0),  # a second governord on the port fails, not shares it
            *KEEPALIVE_SERVER_OPTIONS,
        ]
    )
    try:
        tenants = apply_config(authority, cfg)
        metrics = Metrics()
        metrics.attach(authority)
        service = GovernorService(authority, cfg, tenants, metrics, loop)
        for warning in import_bootstrap(authority, cfg.coordinator):
            _say(warning)
        coordinator = CoordinatorService(
            authority, service.commits, cfg.coordinator.keys, metrics, loop
        )
        coordinator.warn = _say
        authority.start_reaper(0.02)
        server.add_generic_rpc_handlers((service.handler(), coordinator.handler()))
        reloader = CertReloader(cfg.tls) if cfg.tls is not None else None
        bound = [_bind(server, addr, reloader) for addr in cfg.listen]
        if cfg.metrics:
            _serve_metrics(cfg.metrics, metrics, authority)
    except BaseException:
        await server.stop(None)
        authority.close()
        raise
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
    coordinator.stop()
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

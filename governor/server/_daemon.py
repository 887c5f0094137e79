"""governord, the process: open the record, apply the config, serve, drain, stop.

On PostgreSQL the process first binds its addresses as a standby (``_standby``: every call
answered ``not_leader`` with the leader's address) and campaigns (``_leadership``): it tails
the record and, once it holds the leader row's next epoch, loads the rest, applies its config
and serves as the leader (docs/failover.md). On SQLite it leads at once, as it always has.

Shutdown is a designed phase: on SIGTERM/SIGINT stop taking new calls, let running ones finish
for ``drain_s``, then cancel the rest and close the record. A failed commit stops the process
at once with status 70 (the log's ``on_fatal``): serving from memory that is ahead of the record
would hand out answers that can un-happen. SIGHUP re-reads the TLS certificate and key; new
connections use them, no restart needed.

The ``metrics`` address serves governord's HTTP pages (``_routes``: ``/metrics``, ``/health``,
``/health/live``, ``/health/ready``). Its log is one JSON event per line on stderr
(``_logs``); the ``LISTENING`` line on stdout is for the process that started it.

Starting is where the operator's settings meet the machine: a store that cannot be opened,
reached or trusted, an address that cannot be bound, a certificate that cannot be read. Each
is translated here into a ``ConfigError`` naming the setting (``store``, ``listen``,
``metrics``, ``tls``), which ``governord`` prints as one line, exit status 2; whatever was
already started is closed first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from governor import wire
from governor.authority import Authority
from governor.config import ConfigError, GovernordConfig, TlsFiles, is_loopback
from governor.engine import EngineConfig, RecordError
from governor.store import (
    EXIT_COMMIT_FAILED,
    EventLog,
    Loaded,
    StoreError,
    open_backend,
    parse_store,
)
from ratemesh import callguard
from ratemesh import coordinator as cw
from ratemesh.callguard import Caller, CallGuard, GuardLimits, Refused
from ratemesh.checks import with_port
from ratemesh.coordinator import PING_INTERVAL_MIN_MS
from ratemesh.grpcstd import add_standard_services, open_health
from ratemesh.operator import one_line, probe_bind

from ._bootstrap import import_bootstrap
from ._coordinator import CoordinatorService
from ._health import Health
from ._http import HttpServer
from ._leadership import Candidate, holder_id
from ._logs import configure, event
from ._metrics import Metrics
from ._plant import planted
from ._probe import StoreProbe, probe_for
from ._reconcile import apply_config
from ._routes import Site, routes
from ._service import GovernorService
from ._standby import NotLeader, Switch
from ._status import Fail, sha256_hex

__all__ = ["CertReloader", "serve", "run"]

MESSAGE_BYTES_MAX = 1 << 20
# Clients that keep idle connections alive (a mesh node's policy watch pings every
# ratemesh.coordinator.KEEPALIVE_MS) are not sent GOAWAY `too_many_pings`, which gRPC's
# default (one ping in 5 min) answered at the third ping, ending every idle watch.
KEEPALIVE_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", PING_INTERVAL_MIN_MS),
)
# The call guard's bounds (`ratemesh.callguard`), checked after a call's credential is, so
# a call without a known key or live token never holds one: calls admitted at once (about
# 18 KB each while held: 4,096 of them are some 75 MB), and one caller's of them (a tenant's
# key, a session's token, a coordinator key). A unary call's request must arrive within
# `callguard.FIRST_MESSAGE_S` of its headers.
GRPC_CALLS_MAX = 4096
GRPC_CALLER_CALLS_MAX = 1024

log = logging.getLogger("governord")


def _say(text: str) -> None:
    log.info(text)


def _commit_failed(exc: BaseException) -> None:
    """The log's ``on_fatal``: say why as a log event, then stop at once (status 70)."""
    log.critical(
        "commit failed, stopping so a supervisor restarts from the record: %s",
        one_line(exc),
        extra={"fields": {"exit_status": EXIT_COMMIT_FAILED}},
    )
    for handler in log.handlers:
        handler.flush()
    os._exit(EXIT_COMMIT_FAILED)


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
            log.warning(f"certificate reload failed, keeping the old one: {exc}")
            return None
        self.reloads += 1
        _say("certificate reloaded")
        return config

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._config(), self._fetch, require_client_authentication=False
        )


def _open_log(cfg: GovernordConfig) -> EventLog:
    scheme, target = parse_store(cfg.store)
    if not scheme.durable:
        log.warning(f"store {scheme.name}: NOT durable (benchmarks only)")
    schema = os.environ.get("GOVERNOR_PG_SCHEMA", "governor")
    backend = open_backend(scheme.name, target, schema=schema, application_name=_pg_app())
    return EventLog(backend, on_fatal=_commit_failed)


def _pg_app() -> str:
    return os.environ.get("GOVERNOR_PG_APP_NAME", "governord")


def _open_record(cfg: GovernordConfig) -> EventLog:
    """The record opened (not yet loaded). A database that cannot be opened, reached or
    migrated is the ``store`` setting for the operator to fix."""
    try:
        return _open_log(cfg)
    except StoreError as exc:  # its message names the database: the path, or host and port
        raise ConfigError("store", one_line(exc)) from exc


def _open_authority(
    cfg: GovernordConfig, record: EventLog, loaded: Loaded | None = None
) -> Authority:
    """The record loaded (a record that cannot be trusted is the ``store`` setting's too)."""
    try:
        engine = EngineConfig(nodes_per_tenant_max=cfg.nodes_per_tenant_max)
        return Authority(record, snapshot_every=cfg.snapshot_every, loaded=loaded, config=engine)
    except (StoreError, RecordError) as exc:
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
    return with_port(addr, port)


class _Process:
    """What one governord holds while it runs; ``close`` undoes whatever was started."""

    def __init__(self, cfg: GovernordConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.loop = loop
        self.scheme, self.target = parse_store(cfg.store)
        self.kind = self.scheme.name
        self.record: EventLog | None = None
        self.authority: Authority | None = None
        self.service: GovernorService | None = None
        self.coordinator: CoordinatorService | None = None
        self.candidate: Candidate | None = None
        self.epoch: int | None = None
        self.http: HttpServer | None = None
        self.metrics = Metrics()
        self.probe: StoreProbe = probe_for(self.kind, self.target, _pg_app())
        self.switch = Switch(NotLeader(self._leader))
        self.guard = CallGuard(
            open_health(self._identify),
            GuardLimits(calls_max=GRPC_CALLS_MAX, caller_calls_max=GRPC_CALLER_CALLS_MAX),
            on_refused=self._refused,
        )
        self.server = aio.server(
            options=[
                ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
                ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
                ("grpc.so_reuseport", 0),  # a second governord on the port fails, not shares it
                *KEEPALIVE_SERVER_OPTIONS,
                *callguard.server_options(),
            ],
            interceptors=(self.guard,),
        )
        self.server.add_generic_rpc_handlers((self.switch,))
        add_standard_services(  # health SERVING only on the leader that is ready to serve
            self.server,
            dict.fromkeys((wire.SERVICE, cw.COORDINATOR_SERVICE), self._serving),
        )
        self.reloader = CertReloader(cfg.tls) if cfg.tls is not None else None
        self.bound: list[str] = []

    def _serving(self) -> bool:
        """gRPC health: this process leads and is not draining."""
        return self.switch.leading and self.service is not None and not self.service.draining

    def _leader(self) -> tuple[str, int]:
        if self.candidate is None:
            return "", 0
        return self.candidate.leader()

    def _identify(self, method: str, md: callguard.Metadata, context: Any) -> Caller:
        """The call guard's check, from metadata alone and before the call holds anything:
        a known coordinator key, a live session token or a configured API key (what the
        call may do with it is the service's to decide). A standby or a draining leader
        answers every call at once, so those pass."""
        service, coordinator = self.service, self.coordinator
        if service is None or coordinator is None or service.draining:
            return Caller("not_serving")
        prefix, _, name = method.lstrip("/").partition("/")
        if prefix == cw.COORDINATOR_SERVICE:
            ckey = md.get(cw.API_KEY_MD)
            found = coordinator._keys.get(sha256_hex(ckey)) if isinstance(ckey, str) else None
            if found is None:  # worded as the coordinator service words it
                if ckey is None:
                    why = f"coordinator {name} needs an API key ({cw.API_KEY_MD} metadata)"
                    raise _refusal(Fail(grpc.StatusCode.UNAUTHENTICATED, "no_credentials", why))
                if not isinstance(ckey, str):
                    why = "the key must be text"
                    raise _refusal(Fail(grpc.StatusCode.UNAUTHENTICATED, "credentials", why))
                why = "unknown coordinator API key"
                raise _refusal(Fail(grpc.StatusCode.UNAUTHENTICATED, "bad_key", why))
            return Caller(f"coordinator:{found.name}")
        token, key = md.get(wire.TOKEN_MD), md.get(wire.KEY_MD)
        failed: Fail | None = None
        if isinstance(token, str):
            try:
                # a session that ended lately still opens a Multiplex stream (its Release
                # learns how its lease ended, as a unary Release does): the calls decide
                late = name in ("Release", wire.MULTIPLEX)
                who = service.auth.by_token(token, late_release=late)
            except Fail as f:
                failed = f
            else:
                return Caller(f"session:{who.session_id}")
        if isinstance(key, str):
            tenant = service.tenants.get(sha256_hex(key))
            if tenant is not None:
                return Caller(f"tenant:{tenant[0]}")
            failed = failed or Fail(grpc.StatusCode.UNAUTHENTICATED, "bad_key", "unknown API key")
        if failed is None and (token is not None or key is not None):
            failed = Fail(
                grpc.StatusCode.UNAUTHENTICATED, "credentials", "credentials must be text"
            )
        if failed is None:  # worded as the service words it
            spec = wire.METHODS.get(name)
            what = "an API key or a session token"
            if spec is not None:
                what = "a session token" if spec.auth == "token" else "an API key"
            failed = Fail(grpc.StatusCode.UNAUTHENTICATED, "no_credentials", f"{name} needs {what}")
        raise _refusal(failed)

    def _refused(self, exc: Refused, context: Any) -> None:
        self.metrics.calls.labels("guard", exc.code.name).inc()

    def leadership(self) -> dict[str, Any]:
        """The health page's leader check: this process's role and who leads."""
        if not self.scheme.shared:
            return {"role": "leader", "leader": None, "epoch": None}
        if self.switch.leading:
            address = self.candidate.address if self.candidate else None
            return {"role": "leader", "leader": address, "epoch": self.epoch}
        address, epoch = self._leader()
        return {"role": "standby", "leader": address or None, "epoch": epoch}

    def draining(self) -> bool:
        return self.service is not None and self.service.draining

    def _site(self) -> Site:
        facts = {"listen": self.bound, "tls": self.reloader is not None}
        facts["tenants"] = len(self.cfg.tenants)
        health = Health(
            self.authority,
            self.probe,
            draining=self.draining,
            facts=facts,
            leadership=self.leadership,
        )
        return Site(self.authority, self.cfg, self.metrics, health)

    async def bind(self) -> None:
        self.bound = [_bind(self.server, addr, self.reloader) for addr in self.cfg.listen]
        if self.cfg.metrics:
            self.http = HttpServer(routes(self._site()))
            await self.http.start(self.cfg.metrics)

    def advertise(self) -> str:
        """What standbys tell clients: ``GOVERNOR_ADVERTISE`` (one per pod, from its name),
        else ``ha.advertise``, else the first address bound."""
        return os.environ.get("GOVERNOR_ADVERTISE") or self.cfg.ha.advertise or self.bound[0]

    def lead(self, loaded: Loaded | None) -> None:
        """Load the record (through ``loaded``, a standby's tail), apply the config, serve."""
        assert self.record is not None
        self.authority = _open_authority(self.cfg, self.record, loaded)
        authority = self.authority
        tenants = apply_config(authority, self.cfg)
        self.metrics.attach(authority)
        self.service = GovernorService(authority, self.cfg, tenants, self.metrics, self.loop)
        for warning in import_bootstrap(authority, self.cfg.coordinator):
            log.warning(warning)
        self.coordinator = CoordinatorService(
            authority, self.service.commits, self.cfg.coordinator.keys, self.metrics, self.loop
        )
        self.coordinator.warn = log.warning
        authority.start_reaper(0.02)
        self.switch.lead((self.service.handler(), self.coordinator.handler()))
        self.metrics.leader.set(1)
        if self.http is not None:
            self.http.pages = routes(self._site())

    async def close(self, drain_s: float | None) -> None:
        if self.service is not None:
            self.service.draining = True  # /health/ready answers 503 from here on
        if self.coordinator is not None:
            self.coordinator.stop()
        await self.server.stop(drain_s)
        if self.http is not None:
            await self.http.close()
        self.probe.close()
        if self.authority is not None:
            self.authority.close()
        elif self.record is not None:
            self.record.close()


def _refusal(fail: Fail) -> Refused:
    """A guard refusal answered as the service answers the same failure (its detail map)."""
    trailing = ((wire.ERROR_MD, wire.pack(fail.detail)),)
    return Refused(fail.code, fail.detail["message"], fail.detail["reason"], trailing)


async def _elect(proc: _Process, stop: asyncio.Event, announce: Callable[[], None]) -> bool:
    """On PostgreSQL: campaign until this process leads (True) or is stopped (False)."""
    assert proc.record is not None
    backend = proc.record.backend
    proc.candidate = Candidate(proc.record, backend, proc.cfg.ha, proc.advertise(), holder_id())  # type: ignore[arg-type]
    bug = planted()
    if bug is not None:
        log.warning(f"planted bug {bug}: this governord is broken on purpose (tests only)")
    if bug == "skip_epoch_check":
        backend.check_epoch = backend.end_old_holder = False  # type: ignore[attr-defined]
    proc.candidate.tail = bug != "serve_before_replay"
    elected = await proc.candidate.campaign(stop, first=True)
    if elected is None and not stop.is_set():
        address, epoch = proc.candidate.leader()
        event(
            log,
            logging.INFO,
            f"standby: the leader is {address or 'unknown'} (epoch {epoch})",
            role="standby",
            leader=address,
            epoch=epoch,
        )
        proc.metrics.epoch.set(epoch)
        announce()
        elected = await proc.candidate.campaign(stop)
    if elected is None:
        return False
    ha = proc.cfg.ha
    proc.record.fence(renew_every_s=ha.renew_ms / 1000, lease_s=ha.lease_ms / 1000)
    proc.epoch = elected.epoch
    proc.metrics.epoch.set(elected.epoch)
    took = elected.replaced
    event(
        log,
        logging.INFO,
        f"leading with epoch {elected.epoch}"
        + (f", taking over from {took.holder} at {took.address}" if took else ""),
        role="leader",
        epoch=elected.epoch,
        replaced=took.holder if took else None,
        replay_events=len(elected.loaded.events),
    )
    proc.lead(elected.loaded)
    if bug == "skip_epoch_check":
        assert proc.service is not None and proc.coordinator is not None
        proc.service.commits.confirm_reads = False
    return True


async def serve(
    cfg: GovernordConfig, *, on_listening: Callable[[list[str]], None] | None = None
) -> int:
    if not log.handlers:  # embedded (tests): the default log, unless the caller chose one
        configure()
    if cfg.tls is None and not cfg.allow_plaintext:
        bad = [a for a in cfg.listen if not is_loopback(a)]
        if bad:
            log.error(
                f"refusing to serve {bad[0]} without TLS (set allow_plaintext: true to allow)"
            )
            return 2
    loop = asyncio.get_running_loop()
    proc = _Process(cfg, loop)
    stop = asyncio.Event()
    announced = False

    def announce() -> None:
        nonlocal announced
        if announced:
            return
        announced = True
        print(f"LISTENING {' '.join(proc.bound)}", flush=True)
        if on_listening is not None:
            on_listening(proc.bound)

    try:
        proc.record = _open_record(cfg)
        await proc.bind()
        if not proc.scheme.shared:
            proc.lead(None)
        await proc.server.start()
    except BaseException:
        await proc.close(None)
        raise

    def stopping(sig: signal.Signals) -> None:
        if not stop.is_set():
            event(
                log, logging.INFO, f"{sig.name} received", name="shutdown_started", signal=sig.name
            )
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, sig)
    if proc.reloader is not None:
        loop.add_signal_handler(signal.SIGHUP, proc.reloader.request)
    else:
        loop.add_signal_handler(signal.SIGHUP, lambda: _say("SIGHUP: no TLS, nothing to reload"))
    if proc.scheme.shared:
        try:
            leading = await _elect(proc, stop, announce)
        except (StoreError, RecordError) as exc:  # the database went away under a standby
            log.critical(
                "cannot take part in the election, stopping so a supervisor restarts: %s",
                one_line(exc),
                extra={"fields": {"exit_status": EXIT_COMMIT_FAILED}},
            )
            await proc.close(None)
            return EXIT_COMMIT_FAILED
        except BaseException:
            await proc.close(None)
            raise
        if not leading:
            await proc.close(cfg.drain_s)
            _say("stopped (a standby)")
            return 0
    where = proc.scheme.describe(proc.target)
    http = proc.http
    event(
        log,
        logging.INFO,
        f"listening on {', '.join(proc.bound)} ({'TLS' if proc.reloader else 'plaintext'}), "
        f"store {proc.kind} {where}, {len(cfg.tenants)} tenant(s)"
        + (f", metrics and health on {http.address}" if http else ""),
        listen=proc.bound,
        tls=proc.reloader is not None,
        store=proc.kind,
        tenants=len(cfg.tenants),
        http=http.address if http else None,
    )
    announce()
    await stop.wait()
    _say(f"stopping: draining for up to {cfg.drain_s} s")
    await proc.close(cfg.drain_s)
    _say("stopped")
    return 0


def run(cfg: GovernordConfig, *, log_format: str = "json", log_level: str = "INFO") -> int:
    configure(log_format, log_level)
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(serve(cfg))

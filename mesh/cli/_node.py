"""`mesh node`, `mesh status` and `mesh validate`: a standalone member and its config."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from dataclasses import replace
from pathlib import Path

from ratemesh import logs
from ratemesh.checks import check_address, check_choice
from ratemesh.errors import ConfigError

from ._output import emit, one_line, positive_s

__all__ = ["node", "status", "validate"]

LOG_LEVELS = {name: name for name in logs.LOG_LEVELS}


EXIT_WARNINGS = 1  # `mesh validate --strict`: legal, but with warnings


def validate(args: argparse.Namespace) -> int:
    """Check a node config: the summary as JSON, or the one mistake as JSON on stdout (for
    scripts) and one line on stderr naming the file and the field. Warnings are one line
    each on stderr; they fail the check (exit 1) only with `--strict`."""
    from mesh.config import load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        if not args.table:
            print(json.dumps({"ok": False, "error": str(exc), "field": exc.field}, sort_keys=True))
        print(f"mesh validate: {_in_file(args.config, exc)}", file=sys.stderr)
        return 2
    ident = cfg.identity()
    warnings = cfg.warnings()
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    emit(
        {
            "ok": True,
            "warnings": warnings,
            "policies": len(cfg.policies),
            "identity": {
                "member_id": ident.member_id,
                "source": ident.source,
                "stable": ident.stable,
            },
            "membership": cfg.membership.source if cfg.membership else None,
            # the coordination tier the node may dial (docs/redis.md); None: nothing dials
            "shared_state": {
                "redis": None if cfg.shared_state.redis is None else cfg.shared_state.redis.addr,
                "postgres": (
                    None
                    if cfg.shared_state.postgres is None
                    else {"dsn_env": cfg.shared_state.postgres.dsn_env}
                ),
            },
            # what proves a peer's member id (docs/architecture.md): [] is a warning
            "peer_identity": [
                *(["mtls"] if cfg.tls is not None and cfg.tls.require_client_cert else []),
                *(["fleet_secret"] if cfg.fleet_secret is not None else []),
            ],
            # the admission API's addresses (docs/sidecar.md), and which ask for a token
            "sidecar": {
                where.rpartition(".")[2]: {
                    "address": addr,
                    "bearer_token": cfg.sidecar.needs_auth(addr)
                    and bool(cfg.sidecar.tokens or cfg.fleet_secret),
                    # which credential callers send: the sidecar's own, else the fleet secret
                    "token": "sidecar"
                    if cfg.sidecar.tokens
                    else ("fleet_secret" if cfg.fleet_secret is not None else None),
                }
                for where, addr in cfg.sidecar.listens()
            },
        },
        args,
    )
    return EXIT_WARNINGS if warnings and getattr(args, "strict", False) else 0


def _in_file(path: str, exc: ConfigError) -> str:
    """`exc` as one line that names the file as well as the field (once)."""
    text = one_line(str(exc))
    return text if str(Path(path)) in text or path in text else f"{path}: {text}"


def status(args: argparse.Namespace) -> int:
    """A member's view over its Status call. The caller proves itself as a member's streams
    do: with the TLS and fleet secret of the node config it is pointed at (`--config`), or
    a fleet secret file (`--fleet-secret-file`); a dev mesh with neither needs no proof."""
    from mesh.config import load_config
    from mesh.errors import PeerError
    from mesh.peer import fetch_status

    timeout_s = positive_s("--timeout", args.timeout)
    addr, tls, secret = args.addr, None, None
    target: str | None = None  # the member's id; None: learnt from the member
    if args.config:
        try:
            cfg = load_config(args.config)
        except ConfigError as exc:
            print(f"mesh status: {_in_file(args.config, exc)}", file=sys.stderr)
            return 2
        addr = addr or cfg.advertise or cfg.listen
        tls, secret = cfg.tls, cfg.fleet_secret
        target = cfg.member_id or None
    from ._fleet import member_address

    addr, secret = member_address(args, addr, secret, "the member's node config")
    if args.fleet:
        from ._fleet import fleet_status

        return fleet_status(args, addr, tls=tls, secret=secret, target=target, timeout_s=timeout_s)
    try:
        emit(
            asyncio.run(
                fetch_status(addr, tls=tls, timeout_s=timeout_s, fleet_secret=secret, target=target)
            ),
            args,
        )
    except PeerError as exc:  # the member's absence, not the operator's mistake
        print(f"mesh status: {one_line(str(exc))}", file=sys.stderr)
        return 1
    return 0


def node(args: argparse.Namespace) -> int:
    """Run one member until SIGTERM or SIGINT (SIGHUP reloads its policy file); its
    address as one JSON line on stdout."""
    from mesh.config import check_replica_name, load_config
    from mesh.node import Mesh, new_event_loop, tune_gc

    level = check_choice("--log-level", args.log_level.upper(), LOG_LEVELS)
    fmt = check_choice("--log-format", args.log_format, {f: f for f in logs.LOG_FORMATS})
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"mesh node: {_in_file(args.config, exc)}", file=sys.stderr)
        return 2
    if args.member_id:
        cfg = replace(cfg, member_id=check_replica_name("--member-id", args.member_id))
    if args.listen:
        # the config's own listen is checked by its parser; this override skips it
        cfg = replace(cfg, listen=check_address("--listen", args.listen, allow_zero_port=True))
    logs.configure(
        ("",), fmt, level, prefix="mesh node", levels=True
    )  # every logger: grpc's, uvicorn's
    log = logging.getLogger("mesh.node")
    for w in cfg.warnings():
        logs.event(log, logging.WARNING, f"config: {w}", name="config_warning")

    async def serve() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stopping(sig: signal.Signals) -> None:
            if not stop.is_set():
                logs.event(
                    log,
                    logging.INFO,
                    f"{sig.name} received: leaving the ring, draining for up to "
                    f"{cfg.shutdown_drain_ms} ms",
                    name="shutdown_started",
                    signal=sig.name,
                    drain_ms=cfg.shutdown_drain_ms,
                )
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping, sig)
        mesh = Mesh(cfg)

        def reload() -> None:  # SIGHUP: re-read the policy file; a refusal is logged
            try:
                mesh.reload_policies("sighup")
            except ConfigError as exc:
                logging.getLogger("mesh.policy").warning("SIGHUP: %s; nothing reloaded", exc)

        loop.add_signal_handler(signal.SIGHUP, reload)
        try:
            await mesh.astart()
        except OSError as exc:  # each port's bind is a ConfigError naming its field; this is
            await mesh.aclose()  # a last resort for one that was not
            raise ConfigError("listen", f"cannot serve: {exc.strerror or exc}") from exc
        print(
            json.dumps(
                {
                    "member_id": mesh.member_id,
                    "address": mesh.address,
                    "telemetry": mesh.telemetry_address,
                    "sidecar": mesh.sidecar_addresses,  # {"grpc": ..., "http": ...}, those on
                }
            ),
            flush=True,
        )
        await stop.wait()
        began = loop.time()
        await mesh.aclose()
        took_ms = round((loop.time() - began) * 1000)
        logs.event(log, logging.INFO, "stopped", name="shutdown_done", took_ms=took_ms)
        return 0

    tune_gc()  # a standalone node is the process: its owner's allocation rate decides
    loop = new_event_loop()
    try:
        return loop.run_until_complete(serve())
    finally:
        loop.close()

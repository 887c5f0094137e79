"""`mesh node`, `mesh status`, `mesh validate`, `mesh bench owner`, `mesh bench cluster`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from dataclasses import replace
from typing import Any

__all__ = ["add_commands", "run"]


def add_commands(sub: Any, bench_sub: Any) -> None:
    demo = sub.choices.get("demo")
    if demo is not None:  # the networked demo is the default; this flag says so explicitly
        demo.add_argument("--loopback", action="store_true",
                          help="real members on loopback gRPC, live rows on stderr (default)")
    node = sub.add_parser("node", help="run a standalone mesh peer (sidecar, tests)")
    node.add_argument("--config", required=True, help="the node's YAML config")
    node.add_argument("--member-id", help="override member_id from the config")
    node.add_argument("--listen", help="override listen from the config")
    node.add_argument("--log-level", default="WARNING")

    status = sub.add_parser("status", help="print a member's view (JSON)")
    status.add_argument("--addr", required=True, help="the member's peer address host:port")
    status.add_argument("--timeout", type=float, default=5.0)
    status.add_argument("--json", action="store_true")
    status.add_argument("--table", action="store_true")

    val = sub.add_parser("validate", help="check a node config; print warnings")
    val.add_argument("--config", required=True)
    val.add_argument("--json", action="store_true")
    val.add_argument("--table", action="store_true")

    owner = bench_sub.add_parser("owner", help="key-deltas one owner applies per second")
    owner.add_argument("--seconds", type=float, default=5.0)
    owner.add_argument("--feeders", type=int, default=2)
    owner.add_argument("--keys", type=int, default=10_000)
    owner.add_argument("--batch", type=int, default=1000)
    owner.add_argument("--json", action="store_true")
    owner.add_argument("--table", action="store_true")

    cluster = bench_sub.add_parser("cluster", help="a real cluster on loopback: d, excess")
    cluster.add_argument("--workers", type=int, default=4)
    cluster.add_argument("--seconds", type=float, default=5.0)
    cluster.add_argument("--keys", type=int, default=10_000)
    cluster.add_argument("--json", action="store_true")
    cluster.add_argument("--table", action="store_true")


def run(args: argparse.Namespace) -> int | None:
    from mesh.cli import emit

    if args.command == "node":
        return _node(args)
    if args.command == "demo" and args.loopback and args.memory:
        print("mesh demo: --loopback and --memory exclude each other", file=sys.stderr)
        return 2
    if args.command == "demo" and not args.memory:
        from mesh.cli._demo_loopback import run_loopback_demo

        workers = 3 if args.workers is None else args.workers
        if args.seconds <= 0 or workers < 1:
            print("mesh demo: --seconds must be > 0 and --workers >= 1", file=sys.stderr)
            return 2
        emit(run_loopback_demo(seconds=args.seconds, workers=workers), args)
        return 0
    if args.command == "status":
        from mesh.errors import PeerError
        from mesh.peer import fetch_status

        try:
            emit(asyncio.run(fetch_status(args.addr, timeout_s=args.timeout)), args)
        except PeerError as exc:
            print(f"mesh status: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "validate":
        return _validate(args, emit)
    if args.command == "bench" and args.bench == "owner":
        from bench.owner import run as run_owner

        emit(run_owner(seconds=args.seconds, feeders=args.feeders, keys=args.keys,
                       batch=args.batch), args)
        return 0
    if args.command == "bench" and args.bench == "cluster":
        from bench.cluster import run as run_cluster

        emit(run_cluster(workers=args.workers, seconds=args.seconds, keys=args.keys), args)
        return 0
    return None


def _validate(args: argparse.Namespace, emit: Any) -> int:
    from mesh.config import load_config
    from mesh.errors import ConfigError

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        emit({"ok": False, "error": str(exc), "field": exc.field}, args)
        return 2
    ident = cfg.identity()
    warnings = cfg.warnings()
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    emit({"ok": True, "warnings": warnings, "policies": len(cfg.policies),
          "identity": {"member_id": ident.member_id, "source": ident.source,
                       "stable": ident.stable},
          "membership": cfg.membership.source if cfg.membership else None}, args)
    return 0


def _node(args: argparse.Namespace) -> int:
    from mesh.config import load_config
    from mesh.errors import ConfigError
    from mesh.node import Mesh, new_event_loop, tune_gc

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = load_config(args.config)
        if args.member_id:
            cfg = replace(cfg, member_id=args.member_id)
        if args.listen:
            cfg = replace(cfg, listen=args.listen)
    except ConfigError as exc:
        print(f"mesh node: {exc}", file=sys.stderr)
        return 2
    for w in cfg.warnings():
        logging.getLogger("mesh.node").warning("config: %s", w)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            mesh = Mesh(cfg)
            await mesh.astart()
        except ConfigError as exc:
            print(f"mesh node: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"member_id": mesh.member_id, "address": mesh.address,
                          "telemetry": mesh.telemetry_address}), flush=True)
        await stop.wait()
        await mesh.aclose()
        return 0

    tune_gc()  # a standalone node is the process: its owner's allocation rate decides
    loop = new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()

"""The `mesh` command: demo, benchmarks (and, as they land, node, sim, status, validate)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _table(obj: dict[str, Any], prefix: str = "") -> list[str]:
    rows = []
    for k, v in obj.items():
        if isinstance(v, dict):
            rows += _table(v, f"{prefix}{k}.")
        else:
            rows.append(f"{prefix + k:<40} {v}")
    return rows


def emit(result: dict[str, Any], args: argparse.Namespace) -> None:
    """One JSON object on stdout; a human table on stderr (or stdout with --table)."""
    table = "\n".join(_table(result))
    if getattr(args, "table", False):
        print(table)
        return
    print(json.dumps(result, sort_keys=True))
    if not getattr(args, "json", False):
        print(table, file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mesh", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="the main job on its embedded default: a noisy and a "
                                       "quiet tenant, live, then a summary")
    demo.add_argument("--seconds", type=float, default=3.0)
    demo.add_argument("--seed", type=int, default=1, help="the in-memory network's (--memory)")
    demo.add_argument("--workers", type=int, default=None,
                      help="members (default: 3 on loopback, 8 with --memory)")
    demo.add_argument("--memory", action="store_true",
                      help="the mesh cores over the in-memory network, no sockets")
    demo.add_argument("--json", action="store_true", help="JSON only (no table on stderr)")
    demo.add_argument("--table", action="store_true", help="a table instead of JSON")

    bench = sub.add_parser("bench", help="benchmarks of the real code (JSON on stdout)")
    bsub = bench.add_subparsers(dest="bench", required=True)
    hot = bsub.add_parser("hotpath", help="try_admit vs the limits package, in process")
    hot.add_argument("--ops", type=int, default=2_000_000)
    hot.add_argument("--keys", type=int, default=10_000)
    hot.add_argument("--json", action="store_true")
    hot.add_argument("--table", action="store_true")
    for name in _EXTENSIONS:
        _extension(name).add_commands(sub, bsub)
    return p


# Each extension module owns its subcommands: add_commands(sub, bench_sub) registers them and
# run(args) -> int | None handles them (None: not mine). Kept apart so that the simulator
# and the node can grow their commands without editing one shared file.
_EXTENSIONS = ("mesh.cli._sim", "mesh.cli._node")


def _extension(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise

        class _Missing:
            @staticmethod
            def add_commands(sub: Any, bsub: Any) -> None:
                pass

            @staticmethod
            def run(args: argparse.Namespace) -> int | None:
                return None

        return _Missing


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in _EXTENSIONS:
        code = _extension(name).run(args)
        if code is not None:
            return int(code)
    if args.command == "demo":
        from mesh.cli._demo_memory import run_demo

        workers = 8 if args.workers is None else args.workers
        if args.seconds <= 0 or workers < 1:
            print("mesh demo: --seconds must be > 0 and --workers >= 1", file=sys.stderr)
            return 2
        emit(run_demo(seconds=args.seconds, seed=args.seed, workers=workers), args)
        return 0
    if args.command == "bench" and args.bench == "hotpath":
        from bench.hotpath import run

        if args.ops < 1 or args.keys < 1:
            print("mesh bench hotpath: --ops and --keys must be >= 1", file=sys.stderr)
            return 2
        emit(run(ops=args.ops, keys=args.keys), args)
        return 0
    return 2



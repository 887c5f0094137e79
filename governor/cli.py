"""``governord``: benchmarks now; the daemon (``governord --config F``) joins in the server issue.

Every benchmark prints one JSON object on stdout, and a human table on stderr (or on stdout
instead of the JSON with ``--table``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["main"]


def _table(result: dict[str, Any]) -> str:
    width = max(len(k) for k in result)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in result.items())


def _emit(result: dict[str, Any], table: bool) -> None:
    if table:
        print(_table(result))
    else:
        print(json.dumps(result, sort_keys=True))
        print(_table(result), file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="governord", description="ratemesh's strict authority")
    p.add_argument("--config", help="run the daemon (not yet available: the server issue)")
    sub = p.add_subparsers(dest="command")
    bench = sub.add_parser("bench", help="benchmarks; each prints one JSON object")
    bsub = bench.add_subparsers(dest="bench", required=True)
    eng = bsub.add_parser("engine", help="in-process engine: consume_per_s, acquire_release_per_s")
    eng.add_argument("--ops", type=int, default=200_000)
    st = bsub.add_parser("store", help="durable throughput with group commit vs raw commits")
    st.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    st.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: 127.0.0.1:5432/test)")
    st.add_argument("--writers", type=int, default=16)
    st.add_argument("--duration", type=float, default=3.0, help="seconds of concurrent load")
    for b in (eng, st):
        b.add_argument("--json", action="store_true", help="print JSON (the default)")
        b.add_argument("--table", action="store_true", help="print a table instead of JSON")
    val = sub.add_parser("validate", help="check a configuration file")
    val.add_argument("--config", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "bench":
        if args.bench == "engine":
            from governor.bench import engine

            _emit(engine.run(ops=args.ops), args.table)
        else:
            from governor.bench import store

            result = store.run(
                args.store,
                dsn=args.dsn or store.DEFAULT_DSN,
                writers=args.writers,
                duration_s=args.duration,
            )
            _emit(result, args.table)
        return 0
    if args.command == "validate" or args.config:
        print(
            "governord: the daemon and its configuration arrive with the server issue; "
            "not yet available",
            file=sys.stderr,
        )
        return 2
    _parser().print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

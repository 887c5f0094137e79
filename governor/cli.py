"""``governord``: the daemon (``governord [--config F]``), ``validate``, and benchmarks.

Every benchmark prints one JSON object on stdout, and a human table on stderr (or on stdout
instead of the JSON with ``--table``). An operator's mistake - a flag, the config file, a
store that cannot be opened, a port that cannot be bound - is one line on stderr naming the
field or file, exit status 2; ``main`` is the one place that turns it into that line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ratemesh.checks import check_float, check_int
from ratemesh.errors import ConfigError
from ratemesh.operator import EXIT_USAGE, OneLineParser, one_line

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
    p = OneLineParser(prog="governord", description="ratemesh's strict authority")
    p.add_argument("--config", help="run the daemon with this YAML file (default: built-in)")
    p.add_argument(
        "--log-format",
        choices=["json", "text"],
        default="json",
        help="the daemon's log on stderr: one JSON event a line (default) or text",
    )
    p.add_argument(
        "--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO", type=str.upper
    )
    sub = p.add_subparsers(dest="command")
    bench = sub.add_parser("bench", help="benchmarks; each prints one JSON object")
    bsub = bench.add_subparsers(dest="bench", required=True)
    eng = bsub.add_parser("engine", help="in-process engine: consume_per_s, acquire_release_per_s")
    eng.add_argument("--ops", type=int, default=200_000)
    st = bsub.add_parser("store", help="durable throughput with group commit vs raw commits")
    st.add_argument(
        "--store", default="sqlite", help="a durable scheme of governor.store.SCHEMES (sqlite)"
    )
    st.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: 127.0.0.1:5432/test)")
    st.add_argument("--writers", type=int, default=16)
    st.add_argument("--duration", type=float, default=3.0, help="seconds of concurrent load")
    sc = bsub.add_parser("scenarios", help="the seed's scenarios, without and with governord")
    sc.add_argument("--dsn", default=None, help="PostgreSQL DSN for the overhead figures")
    sc.add_argument("--quick", action="store_true", help="smaller runs (tests)")
    sc.add_argument("--only", default=None, help="comma-separated scenario names")
    fo = bsub.add_parser("failover", help="leader failovers under load, checked by the clients")
    fo.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: 127.0.0.1:5432/test)")
    fo.add_argument("--failovers", type=int, default=20)
    fo.add_argument("--callers", type=int, default=16)
    fo.add_argument("--seed", type=int, default=0)
    fo.add_argument(
        "--pause-every", type=int, default=4, help="every Nth failover pauses the leader (0: none)"
    )
    fo.add_argument("--history", default=None, help="save the recorded history (JSON) here")
    for b in (eng, st, sc, fo):
        b.add_argument("--json", action="store_true", help="print JSON (the default)")
        b.add_argument("--table", action="store_true", help="print a table instead of JSON")
    hook = sub.add_parser("hook", help="a PreToolUse hook for agent CLIs (governor/hook.py)")
    hook.add_argument("--source", choices=["claude", "codex"], default="claude")
    hook.add_argument("--tool-calls", type=int, default=500, help="tool calls per run")
    hook.add_argument("--subagents", type=int, default=20, help="subagents per run")
    hook.add_argument("--minutes", type=float, default=None, help="the run's time budget")
    hook.add_argument("--addr", default=None, help="governord (default: GOVERNOR_ADDR)")
    hook.add_argument("--timeout-s", type=float, default=5.0, help="then it fails closed")
    ui = sub.add_parser("ui", help="a terminal screen over your subtree (textual)")
    ui.add_argument("--addr", default=None, help="governord (default: GOVERNOR_ADDR)")
    val = sub.add_parser("validate", help="check a configuration file")
    val.add_argument("--config", dest="validate_config", required=True)
    val.add_argument(
        "--strict", action="store_true", help="exit 1 when there is any warning (for CI)"
    )
    return p


EXIT_WARNINGS = 1  # `governord validate --strict`: legal, but with warnings


def _validate(path: str, strict: bool = False) -> int:
    """The summary on stdout; each warning one line on stderr, failing only with --strict."""
    from governor.config import config_warnings, load_config

    cfg = load_config(path)
    warnings = config_warnings(cfg)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    coord = cfg.coordinator
    print(
        f"governord: {path} is valid: {len(cfg.tenants)} tenant(s), listen "
        f"{', '.join(cfg.listen)}, store {cfg.store_kind()[0]}"
        + (", TLS" if cfg.tls else "")
        + (f", {len(coord.keys)} coordinator key(s)" if coord.keys else "")
        + (f", {len(coord.bootstrap)} bootstrap policies" if coord.policies_file else "")
    )
    return EXIT_WARNINGS if warnings and strict else 0


# BoringSSL (inside grpcio) fixes the TLS 1.3 suites, and grpcio has no minimum-version
# setting; restricting the TLS 1.2 suites to one no client can use without a pre-shared key
# makes a 1.2-only client fail the handshake while 1.3 is untouched. grpc reads this once,
# when it is first loaded, so it must be set before anything imports grpc.
TLS13_ONLY = "PSK-AES128-CBC-SHA"


def _daemon(path: str | None, log_format: str, log_level: str) -> int:
    if "grpc" not in sys.modules:
        os.environ.setdefault("GRPC_SSL_CIPHER_SUITES", TLS13_ONLY)
    from governor.config import TenantConfig, config_warnings, default_config, load_config
    from governor.server import run

    if path is None:
        cfg = default_config()
        key = os.environ.get("GOVERNOR_API_KEY")
        note = "no tenants"
        if key:
            import dataclasses
            import hashlib

            tenant = TenantConfig("default", hashlib.sha256(key.encode()).hexdigest())
            cfg = dataclasses.replace(cfg, tenants=(tenant,))
            note = "tenant 'default' with the key in GOVERNOR_API_KEY"
        print(
            f"governord: no --config given: serving {cfg.listen[0]} with SQLite at "
            f"./{cfg.store_kind()[1]}, {note}",
            file=sys.stderr,
            flush=True,
        )
    else:
        cfg = load_config(path)
    for w in config_warnings(cfg):  # what `governord validate` warns about, said at start too
        print(f"governord: warning: {w}", file=sys.stderr, flush=True)
    return run(cfg, log_format=log_format, log_level=log_level)


def main(argv: list[str] | None = None) -> int:
    # Only gRPC's errors on stderr, where the log is one JSON object a line (as `mesh`).
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ConfigError as exc:
        # the file as well as the field, once: "governord: g.yaml: drain_s: must be >= 0"
        path = args.validate_config if args.command == "validate" else args.config
        text = one_line(str(exc))
        where = f"{path}: " if path and path not in text else ""
        print(f"governord: {where}{text}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except BrokenPipeError:  # stdout closed early (`governord bench engine | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as Python's docs
        return 1  # advise, so the interpreter's final flush does not raise again


UI_CONNECT_TIMEOUT_S = 3.0  # `governord ui`: past this, governord does not answer (one line)
EXIT_UNAVAILABLE = 69  # governord named but not answering (sysexits EX_UNAVAILABLE)


def _ui_reaches(flag: str | None) -> tuple[str, str | None]:
    """The governord `governord ui` shows (--addr, else GOVERNOR_ADDR; neither is a mistake,
    not a wait on a default address), checked before the screen opens: a key it refuses is
    ConfigError naming GOVERNOR_API_KEY; no answer within UI_CONNECT_TIMEOUT_S is the line
    returned, so the screen never sits on "connecting..."."""
    import asyncio

    from governor.client import AuthError, Client, GovernorClientError, ScopeError

    addr = flag or os.environ.get("GOVERNOR_ADDR")
    if not addr:
        raise ConfigError("--addr", "which governord? give --addr host:port or set GOVERNOR_ADDR")
    field = "--addr" if flag else "GOVERNOR_ADDR"
    if not os.environ.get("GOVERNOR_API_KEY"):
        raise ConfigError("GOVERNOR_API_KEY", "not set: the screen shows the subtree of that key")
    if "://" in addr:
        raise ConfigError(field, f"{addr!r} is a URL; governord takes host:port (gRPC)")

    async def reach() -> None:
        client = Client(addr, connect_timeout_s=UI_CONNECT_TIMEOUT_S)
        try:
            await client.connect()
        finally:
            await client.close()

    try:
        asyncio.run(reach())
    except (AuthError, ScopeError) as exc:
        raise ConfigError("GOVERNOR_API_KEY", f"governord at {addr} refused it ({exc})") from exc
    except GovernorClientError as exc:
        return addr, f"governord at {addr} ({field}) does not answer: {one_line(exc)}"
    return addr, None


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "bench":
        if args.bench == "scenarios":
            from governor.bench import scenarios

            only = args.only.split(",") if args.only else None
            _emit(scenarios.run(dsn=args.dsn, quick=args.quick, only=only), args.table)
            return 0
        if args.bench == "failover":
            from governor.bench import failover

            params = failover.Params(
                failovers=check_int("--failovers", args.failovers, minimum=1),
                callers=check_int("--callers", args.callers, minimum=1),
                seed=check_int("--seed", args.seed, minimum=0),
                pause_every=check_int("--pause-every", args.pause_every, minimum=0),
                dsn=args.dsn or failover.DEFAULT_DSN,
                history_path=args.history,
            )
            _emit(failover.run(params), args.table)
            return 0
        if args.bench == "engine":
            from governor.bench import engine

            _emit(engine.run(ops=check_int("--ops", args.ops, minimum=1)), args.table)
        else:
            from governor.bench import store
            from governor.store import SCHEMES, StoreUnavailable

            if args.store not in store.KINDS:
                kinds = ", ".join(store.KINDS)
                raise ConfigError("--store", f"must be one of {kinds}, got {args.store!r}")
            writers = check_int("--writers", args.writers, minimum=1)
            if check_float("--duration", args.duration) <= 0:
                raise ConfigError("--duration", f"must be > 0, got {args.duration}")
            try:
                result = store.run(
                    args.store,
                    dsn=args.dsn or store.DEFAULT_DSN,
                    writers=writers,
                    duration_s=args.duration,
                )
            except StoreUnavailable as exc:
                flag = "--dsn" if SCHEMES[args.store].whole else "--store"
                raise ConfigError(flag, f"cannot open the {args.store} store: {exc}") from exc
            _emit(result, args.table)
        return 0
    if args.command == "validate":
        return _validate(args.validate_config, args.strict)
    if args.command == "ui":
        try:
            from governor.tui import GovernorUI
        except ImportError as exc:
            raise ConfigError("ui", f"needs textual: pip install 'ratemesh[ui]' ({exc})") from exc
        addr, failed = _ui_reaches(args.addr)
        if failed is not None:
            print(f"governord ui: {failed}", file=sys.stderr, flush=True)
            return EXIT_UNAVAILABLE
        GovernorUI(addr).run()
        return 0
    if args.command == "hook":
        from governor.hook import HookLimits, run_hook

        limits = HookLimits(
            tool_calls=check_int("--tool-calls", args.tool_calls, minimum=1),
            subagents=check_int("--subagents", args.subagents, minimum=1),
            minutes=None if args.minutes is None else check_float("--minutes", args.minutes),
            source=args.source,
            timeout_s=check_float("--timeout-s", args.timeout_s, minimum=0.1),
        )
        return run_hook(limits, addr=args.addr)
    return _daemon(args.config, args.log_format, args.log_level)


if __name__ == "__main__":
    sys.exit(main())

"""`mesh bench hotpath`, `owner`, `cluster`, `churn`, `flood`, `policy`, `strict`, `sidecar`,
`redis` and `suite`: benchmarks of the real code, JSON on stdout."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ratemesh.checks import check_float, check_int
from ratemesh.errors import ConfigError

from ._output import emit, one_line, positive_s

T = TypeVar("T")

__all__ = [
    "churn",
    "cluster",
    "flood",
    "hotpath",
    "owner",
    "policy",
    "redis",
    "sidecar",
    "strict",
    "suite",
]


def hotpath(args: argparse.Namespace) -> int:
    from bench.hotpath import run

    emit(
        run(
            ops=check_int("--ops", args.ops, minimum=1),
            keys=check_int("--keys", args.keys, minimum=1),
        ),
        args,
    )
    return 0


def owner(args: argparse.Namespace) -> int:
    from bench.owner import run
    from mesh.core.messages import REPORT_ROWS_MAX

    emit(
        run(
            seconds=positive_s("--seconds", args.seconds),
            feeders=check_int("--feeders", args.feeders, minimum=1),
            keys=check_int("--keys", args.keys, minimum=1),
            batch=check_int("--batch", args.batch, minimum=1, maximum=REPORT_ROWS_MAX),
        ),
        args,
    )
    return 0


def cluster(args: argparse.Namespace) -> int:
    from bench.cluster import run

    emit(
        run(
            workers=check_int("--workers", args.workers, minimum=1),
            seconds=positive_s("--seconds", args.seconds),
            keys=check_int("--keys", args.keys, minimum=1),
        ),
        args,
    )
    return 0


def churn(args: argparse.Namespace) -> int:
    from bench.churn import run

    emit(
        run(
            tenants=check_int("--tenants", args.tenants, minimum=1),
            idle_s=positive_s("--idle-seconds", args.idle_seconds),
            top_k=check_int("--top-k", args.top_k, minimum=1, maximum=10_000),
            waves=check_int("--waves", args.waves, minimum=1, maximum=100),
        ),
        args,
    )
    return 0


def flood(args: argparse.Namespace) -> int:
    from bench.flood import run
    from mesh.core.messages import REPORT_ROWS_MAX

    emit(
        run(
            seconds=positive_s("--seconds", args.seconds),
            batch_keys=check_int(
                "--batch-keys", args.batch_keys, minimum=1, maximum=REPORT_ROWS_MAX
            ),
        ),
        args,
    )
    return 0


def policy(args: argparse.Namespace) -> int:
    from bench.policy import run

    emit(
        run(
            nodes=check_int("--nodes", args.nodes, minimum=1, maximum=64),
            pushes=check_int("--pushes", args.pushes, minimum=1, maximum=100_000),
            in_process=args.in_process,
        ),
        args,
    )
    return 0


def strict(args: argparse.Namespace) -> int:
    from bench.strict import THREADS_MAX, WORKERS_MAX, run

    if args.sweep:
        return _strict_sweep(args)
    for flag, value in (("--b-over-r", args.b_over_r), ("--delay-ms", args.delay_ms)):
        if value is not None:
            raise ConfigError(flag, "is a --sweep flag")
    if args.credit is not None:
        raise ConfigError("--credit", "is a --sweep flag")
    workers = [4] if args.workers is None else _ints("--workers", args.workers, WORKERS_MAX)
    if len(workers) != 1:
        raise ConfigError("--workers", f"takes one number without --sweep, got {args.workers!r}")
    emit(
        run(
            workers=workers[0],
            threads=check_int("--threads", args.threads, minimum=1, maximum=THREADS_MAX),
            seconds=positive_s("--seconds", 10.0 if args.seconds is None else args.seconds),
            offered_x=positive_s("--offered-x", 5.0 if args.offered_x is None else args.offered_x),
            mode=args.mode,
        ),
        args,
    )
    return 0


def _strict_sweep(args: argparse.Namespace) -> int:
    """`mesh bench strict --sweep`: one row per (B/R, workers, delay), progress on stderr."""
    from bench import strict_sweep as sweep
    from bench.strict import THREADS_MAX, WORKERS_MAX

    def progress(line: str) -> None:
        print(f"mesh bench strict --sweep: {line}", file=sys.stderr, flush=True)

    b_over_r: Sequence[float] = sweep.B_OVER_R_S
    if args.b_over_r is not None:
        b_over_r = _floats("--b-over-r", args.b_over_r, 1 / sweep.RATE, sweep.B_OVER_R_MAX_S)
    delays: Sequence[float] = sweep.DELAY_MS
    if args.delay_ms is not None:
        delays = _floats("--delay-ms", args.delay_ms, 0.0, sweep.DELAY_MS_MAX)
    workers: Sequence[int] = sweep.WORKERS
    if args.workers is not None:
        workers = _ints("--workers", args.workers, WORKERS_MAX)
    rows = len(b_over_r) * len(workers) * len(delays)
    if rows > sweep.ROWS_MAX:
        raise ConfigError("--sweep", f"would run {rows} rows; at most {sweep.ROWS_MAX}")
    seconds = sweep.SECONDS if args.seconds is None else args.seconds
    offered_x = sweep.OFFERED_X if args.offered_x is None else args.offered_x
    result = sweep.run(
        b_over_r_s=b_over_r,
        workers=workers,
        delay_ms=delays,
        seconds=positive_s("--seconds", seconds),
        threads=check_int("--threads", args.threads, minimum=1, maximum=THREADS_MAX),
        offered_x=positive_s("--offered-x", offered_x),
        credit=None if args.credit is None else _credit(args.credit),
        mode=args.mode,
        progress=progress,
    )
    emit(result, args, sweep.table(result))
    return 0


def _items(flag: str, text: str, parse: Callable[[str], T], what: str) -> list[T]:
    """A comma-separated list, each item read by `parse` (a ValueError names the flag)."""
    out = []
    for part in text.split(","):
        try:
            out.append(parse(part.strip()))
        except ValueError:
            problem = f"must be a comma-separated list of {what}, got {text!r}"
            raise ConfigError(flag, problem) from None
    return out


def _ints(flag: str, text: str, maximum: int) -> list[int]:
    """A comma-separated list of whole numbers in [1, maximum]."""
    items = _items(flag, text, int, "whole numbers")
    return [check_int(flag, n, minimum=1, maximum=maximum) for n in items]


def _floats(flag: str, text: str, minimum: float, maximum: float) -> list[float]:
    """A comma-separated list of finite numbers in [minimum, maximum]."""
    items = _items(flag, text, float, "numbers")
    return [check_float(flag, x, minimum=minimum, maximum=maximum) for x in items]


def _credit(text: str) -> dict[str, int]:
    """`--credit`: a YAML mapping of `ratemesh.credit.CreditConfig` knobs, checked as the
    node's `strict.credit` section is, so a mistake is one line here, not a worker's."""
    from dataclasses import fields

    import yaml

    from ratemesh.checks import check_keys
    from ratemesh.credit import CreditConfig

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("--credit", f"is not YAML: {one_line(str(exc))}") from None
    if not isinstance(raw, dict):
        raise ConfigError("--credit", f"must be a mapping, got {text!r}")
    check_keys("--credit", raw, {f.name for f in fields(CreditConfig)}, error=ConfigError)
    try:
        CreditConfig(**raw)
    except ConfigError as exc:
        raise ConfigError(f"--credit.{exc.field}", exc.problem) from exc
    return raw


def sidecar(args: argparse.Namespace) -> int:
    from bench.sidecar import CLIENTS_MAX, run
    from mesh.config import SidecarConfig

    emit(
        run(
            runs=check_int("--runs", args.runs, minimum=1, maximum=100),
            seconds=positive_s("--seconds", args.seconds),
            batch=check_int("--batch", args.batch, minimum=1, maximum=SidecarConfig().items_max),
            clients=check_int("--clients", args.clients, minimum=1, maximum=CLIENTS_MAX),
            streams=check_int("--streams", args.streams, minimum=1, maximum=256),
            connections=check_int("--connections", args.connections, minimum=1, maximum=256),
        ),
        args,
    )
    return 0


def redis(args: argparse.Namespace) -> int:
    from bench.redis import WORKERS_MAX, run

    emit(
        run(
            workers=check_int("--workers", args.workers, minimum=1, maximum=WORKERS_MAX),
            seconds=positive_s("--seconds", args.seconds),
        ),
        args,
    )
    return 0


def suite(args: argparse.Namespace) -> int:
    """Exit 0 with regressions too (the JSON says them) unless --fail-on-regression."""
    from bench.suite import DEFAULT_BASELINE, run, table

    def progress(line: str) -> None:
        print(f"mesh bench suite: {line}", file=sys.stderr, flush=True)

    result = run(
        baseline_path=Path(args.baseline) if args.baseline else DEFAULT_BASELINE,
        quick=args.quick,
        runs=check_int("--runs", args.runs, minimum=1, maximum=20),
        write=args.write_baseline,
        force=args.force,
        progress=progress,
    )
    emit(result, args, table(result))
    return 1 if args.fail_on_regression and result["regressions"] else 0

"""`mesh bench hotpath`, `owner`, `cluster`, `churn`, `flood`, `policy`, `strict`, `sidecar`,
`redis` and `suite`: benchmarks of the real code, JSON on stdout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ratemesh.checks import check_int

from ._extras import require
from ._output import emit, positive_s
from ._progress import shows_progress

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


@shows_progress("mesh bench hotpath")
def hotpath(args: argparse.Namespace) -> int:
    require("limits", "limits")
    from bench.hotpath import run

    emit(
        run(
            ops=check_int("--ops", args.ops, minimum=1),
            keys=check_int("--keys", args.keys, minimum=1),
        ),
        args,
    )
    return 0


@shows_progress("mesh bench owner", lambda a: a.seconds)
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


@shows_progress("mesh bench cluster", lambda a: a.seconds)
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


@shows_progress("mesh bench churn", lambda a: a.idle_seconds * a.waves)
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


@shows_progress("mesh bench flood", lambda a: a.seconds)
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


@shows_progress("mesh bench policy")
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


@shows_progress("mesh bench strict", lambda a: a.seconds)
def strict(args: argparse.Namespace) -> int:
    from bench.strict import THREADS_MAX, WORKERS_MAX, run

    emit(
        run(
            workers=check_int("--workers", args.workers, minimum=1, maximum=WORKERS_MAX),
            threads=check_int("--threads", args.threads, minimum=1, maximum=THREADS_MAX),
            seconds=positive_s("--seconds", args.seconds),
            offered_x=positive_s("--offered-x", args.offered_x),
            mode=args.mode,
        ),
        args,
    )
    return 0


@shows_progress("mesh bench sidecar", lambda a: a.seconds * a.runs)
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


@shows_progress("mesh bench redis", lambda a: a.seconds)
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
    require("limits", "limits")  # its hotpath figures run beside limits
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

"""`mesh sim list`, `mesh sim run` and `mesh sim sweep`: the deterministic fleet simulator."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from ratemesh.checks import check_int
from ratemesh.errors import ConfigError

from ._extras import require
from ._output import positive_s
from ._progress import progress

__all__ = ["list_scenarios", "run", "sweep"]


def list_scenarios(args: argparse.Namespace) -> int:
    from sim import scenario as scenarios

    for name in scenarios.names():
        print(f"{name:<18} {scenarios.load(name).description}")
    return 0


def sweep(args: argparse.Namespace) -> int:
    from sim import scenario as scenarios
    from sim.sweep import sweep as run_sweep

    chosen = args.scenarios.split(",") if args.scenarios else None
    strategies = tuple(args.strategies.split(","))
    for n in chosen or ():
        if n not in scenarios.names():
            raise ConfigError(
                "--scenarios",
                f"unknown scenario {n!r}; expected some of: " + ", ".join(scenarios.names()),
            )
    _check_strategies(strategies)
    check_int("--seeds", args.seeds, minimum=1)
    with progress(args, "mesh sim sweep") as advance:
        result = run_sweep(chosen, args.seeds, strategies, advance)
    print(json.dumps(result, sort_keys=True))
    return 0


def _check_strategies(names: tuple[str, ...]) -> None:
    from sim.scenario import STRATEGIES

    for n in names:
        if n not in STRATEGIES:
            raise ConfigError(
                "--strategies",
                f"unknown strategy {n!r}; expected some of: " + ", ".join(STRATEGIES),
            )


def run(args: argparse.Namespace) -> int:
    from sim import scenario as scenarios
    from sim.runner import run as run_scenario

    sc = scenarios.load(args.scenario) if args.scenario else scenarios.load_file(args.scenario_file)
    if args.duration is not None:
        sc = replace(sc, duration_s=positive_s("--duration", args.duration))
    names = args.strategies.split(",") if args.strategies else None
    _check_strategies(tuple(names or ()))
    if args.plot:
        require("matplotlib", "--plot")  # before the run, not after it
    with progress(args, f"mesh sim run {sc.name}") as advance:
        result, runs = run_scenario(sc, args.seed, names, advance)
    if args.plot:
        from sim.plot import plot

        limits = {t.name: (t.policy or sc.policy).rate for t in sc.tenants}
        limits.update({n: sc.policy.rate for r in runs for n in r.series if n not in limits})
        if args.tenant is not None and args.tenant not in limits:
            raise ConfigError(
                "--tenant",
                f"no tenant {args.tenant!r} in this run; expected "
                "one of: " + ", ".join(sorted(limits)),
            )
        try:
            drawn = plot(result, runs, args.plot, limits, args.tenant)
        except OSError as exc:
            raise ConfigError("--plot", f"cannot write {args.plot}: {exc.strerror}") from exc
        result["plot"] = {"file": args.plot, "tenant": drawn}
    if args.table:
        print(_table(result))
        return 0
    print(json.dumps(result, sort_keys=True))
    if not args.json:
        print(_table(result), file=sys.stderr)
    return 0


COLUMNS = (
    "admitted",
    "ideal",
    "max_excess",
    "bound",
    "within_bound",
    "utilisation",
    "fairness",
    "quiet_share",
    "messages_per_worker_s",
    "round_trips_per_request",
)
HEADINGS = (
    "admitted",
    "ideal",
    "max_excess",
    "bound",
    "within",
    "util",
    "fairness",
    "quiet",
    "msgs/w/s",
    "rtt/req",
)


def _table(result: dict[str, Any]) -> str:
    head = f"{'strategy':<18}" + "".join(f"{c:>14}" for c in HEADINGS)
    rows = [f"scenario {result['scenario']} seed {result['seed']}", head]
    for name, s in result["strategies"].items():
        cells = [s[c] for c in COLUMNS]
        rows.append(f"{name:<18}" + "".join(f"{_fmt(v):>14}" for v in cells))
    return "\n".join(rows)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e12:
            return str(int(v))  # a count held as a float (an excess over every interval)
        return f"{v:.4g}"
    return "-" if v is None else str(v)

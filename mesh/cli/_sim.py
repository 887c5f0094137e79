"""`mesh sim list` and `mesh sim run`: the simulator's commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_commands", "run"]


def add_commands(sub: Any, bench_sub: Any) -> None:
    sim = sub.add_parser("sim", help="the deterministic fleet simulator")
    ssub = sim.add_subparsers(dest="sim", required=True)
    ssub.add_parser("list", help="the scenarios shipped in sim/scenarios")
    r = ssub.add_parser("run", help="run a scenario on every strategy; JSON on stdout")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--scenario", help="a shipped scenario's name")
    which.add_argument("--scenario-file", help="a scenario YAML file")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--strategies", help="comma-separated subset (default: the scenario's)")
    r.add_argument("--duration", type=float, help="override the scenario's duration_s")
    r.add_argument("--plot", metavar="FILE.png", help="draw admitted rate vs limit")
    r.add_argument("--tenant", help="the tenant to plot (default: the first explicit one)")
    r.add_argument("--json", action="store_true", help="JSON only (no table on stderr)")
    r.add_argument("--table", action="store_true", help="a table instead of JSON")
    sw = ssub.add_parser("sweep", help="many seeds of every scenario: does the bound hold?")
    sw.add_argument("--seeds", type=int, default=20)
    sw.add_argument("--scenarios", help="comma-separated (default: all but scale)")
    sw.add_argument("--strategies", default="mesh", help="comma-separated (default: mesh)")
    sw.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int | None:
    if args.command != "sim":
        return None
    from dataclasses import replace

    from mesh.errors import MeshError
    from sim import scenario as scenarios

    if args.sim == "list":
        for name in scenarios.names():
            print(f"{name:<18} {scenarios.load(name).description}")
        return 0
    if args.sim == "sweep":
        from sim.sweep import sweep

        chosen = args.scenarios.split(",") if args.scenarios else None
        strategies = tuple(args.strategies.split(","))
        bad = [n for n in chosen or () if n not in scenarios.names()]
        bad += [s for s in strategies if s not in scenarios.STRATEGIES]
        if bad or args.seeds < 1:
            print(f"mesh sim sweep: unknown scenario or strategy, or --seeds < 1: {bad}",
                  file=sys.stderr)
            return 2
        print(json.dumps(sweep(chosen, args.seeds, strategies), sort_keys=True))
        return 0
    from sim.runner import run as run_scenario

    try:
        sc = (scenarios.load(args.scenario) if args.scenario
              else scenarios.load_file(args.scenario_file))
        if args.duration is not None:
            if args.duration <= 0:
                raise scenarios.ConfigError("--duration", "must be > 0")
            sc = replace(sc, duration_s=args.duration)
        names = args.strategies.split(",") if args.strategies else None
        for n in names or ():
            if n not in scenarios.STRATEGIES:
                raise scenarios.ConfigError("--strategies", f"unknown strategy {n!r}; expected "
                                            "some of: " + ", ".join(scenarios.STRATEGIES))
    except MeshError as exc:
        print(f"mesh sim: {exc}", file=sys.stderr)
        return 2
    result, runs = run_scenario(sc, args.seed, names)
    if args.plot:
        from sim.plot import plot

        limits = {t.name: (t.policy or sc.policy).rate for t in sc.tenants}
        limits.update({n: sc.policy.rate for r in runs for n in r.series if n not in limits})
        result["plot"] = {"file": args.plot,
                          "tenant": plot(result, runs, args.plot, limits, args.tenant)}
    if args.table:
        print(_table(result))
        return 0
    print(json.dumps(result, sort_keys=True))
    if not args.json:
        print(_table(result), file=sys.stderr)
    return 0


COLUMNS = ("admitted", "ideal", "max_excess", "bound", "within_bound", "utilisation",
           "fairness", "quiet_share", "messages_per_worker_s", "round_trips_per_request")


def _table(result: dict[str, Any]) -> str:
    head = f"{'strategy':<18}" + "".join(f"{c:>14}" for c in ("admitted", "ideal", "max_excess",
                                                              "bound", "within", "util",
                                                              "fairness", "quiet", "msgs/w/s",
                                                              "rtt/req"))
    rows = [f"scenario {result['scenario']} seed {result['seed']}", head]
    for name, s in result["strategies"].items():
        cells = [s[c] for c in COLUMNS]
        rows.append(f"{name:<18}" + "".join(f"{_fmt(v):>14}" for v in cells))
    return "\n".join(rows)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)

"""The `mesh` command: the parser, the one dispatch table, and the operator boundary.

One module per group of commands (`_demo`, `_node` for node/status/validate, `_sim`,
`_bench`), `_output` for how they all print. This package is the only mesh code that imports
the simulator (`sim`) and the benchmarks (`bench`), which run from a checkout (`_checkout`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from ratemesh.errors import ConfigError

from . import _bench, _checkout, _demo, _fleet, _node, _policy, _sim
from ._output import OneLineParser, emit, one_line

__all__ = ["COMMANDS", "emit", "main"]

Handler = Callable[[argparse.Namespace], int]

# The one dispatch table: (command, subcommand) -> handler. Each handler imports what it
# drives when it runs, so `mesh --help` loads neither grpc nor the simulator.
COMMANDS: dict[tuple[str, ...], Handler] = {
    ("demo",): _demo.demo,
    ("node",): _node.node,
    ("status",): _node.status,
    ("validate",): _node.validate,
    ("sim", "list"): _sim.list_scenarios,
    ("sim", "run"): _sim.run,
    ("sim", "sweep"): _sim.sweep,
    ("bench", "hotpath"): _bench.hotpath,
    ("bench", "owner"): _bench.owner,
    ("bench", "cluster"): _bench.cluster,
    ("bench", "churn"): _bench.churn,
    ("bench", "flood"): _bench.flood,
    ("bench", "policy"): _bench.policy,
    ("bench", "strict"): _bench.strict,
    ("bench", "sidecar"): _bench.sidecar,
    ("bench", "redis"): _bench.redis,
    ("bench", "suite"): _bench.suite,
    **{("policy", name): fn for name, fn in _policy.SUBCOMMANDS.items()},
    **{("fleet", name): fn for name, fn in _fleet.SUBCOMMANDS.items()},
}


DESCRIPTION = (
    "ratemesh's mesh: `demo` shows a noisy and a quiet tenant sharing fleet-wide "
    "limits; `node`, `status` and `validate` run, inspect and check a standalone "
    "member; `policy` pushes and reads mesh policies at governord; `sim` runs the "
    "deterministic fleet simulator; `bench` the benchmarks "
    "of the real code."
)
EPILOG = (
    "Reports are one JSON object on stdout (a table on stderr, or the table alone with "
    "--table). A mistake in a flag or a file is one line on stderr naming it, exit "
    "status 2."
)


def _output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="JSON only (no table on stderr)")
    p.add_argument("--table", action="store_true", help="a table instead of JSON")


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="mesh", description=DESCRIPTION, epilog=EPILOG)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="the main job on its embedded default: a noisy and a "
        "quiet tenant, live, then a summary",
    )
    demo.add_argument("--seconds", type=float, default=3.0)
    demo.add_argument("--seed", type=int, default=1, help="the in-memory network's (--memory)")
    demo.add_argument(
        "--workers",
        type=int,
        default=None,
        help="members (default: 3 on loopback, 8 with --memory)",
    )
    demo.add_argument(
        "--loopback",
        action="store_true",
        help="real members on loopback gRPC, live rows on stderr (default)",
    )
    demo.add_argument(
        "--memory",
        action="store_true",
        help="the mesh cores over the in-memory network, no sockets",
    )
    _output_flags(demo)

    node = sub.add_parser(
        "node", help="run a standalone mesh peer (sidecar, tests); SIGHUP reloads its policy file"
    )
    node.add_argument("--config", required=True, help="the node's YAML config")
    node.add_argument("--member-id", help="override member_id from the config")
    node.add_argument("--listen", help="override listen from the config")
    node.add_argument("--log-level", default="INFO")
    node.add_argument(
        "--log-format",
        default="json",
        help="json (one object per line: ts, level, logger, event, msg, fields) or text",
    )

    status = sub.add_parser(
        "status",
        help="print a member's view (JSON); --fleet: every member's policy generations",
        description="A member's view over its Status call. With --fleet, ask that member "
        "for the ring and then every member in parallel (all within --timeout) which "
        "generation of each limit it enforces; print member, limit, generation and flag "
        "divergence. Exit status: 0 when all answered and agree, 1 when members enforce "
        "different generations of a limit, a member did not answer or the member asked "
        "did not answer, 2 for a mistake in a flag or file.",
    )
    status.add_argument(
        "--addr", help="the member's peer address host:port (default: the --config's)"
    )
    status.add_argument(
        "--config",
        help="the member's node config: its address, TLS and fleet secret prove the caller",
    )
    status.add_argument(
        "--fleet-secret-file", help="prove the caller with this fleet secret (one a line)"
    )
    status.add_argument(
        "--fleet",
        action="store_true",
        help="every ring member's enforced generation per limit; exit 1 if they diverge",
    )
    status.add_argument(
        "--timeout", type=float, default=5.0, help="seconds (with --fleet: for the whole fleet)"
    )
    _output_flags(status)

    val = sub.add_parser("validate", help="check a node config; print warnings")
    val.add_argument("--config", required=True)
    val.add_argument(
        "--strict", action="store_true", help="exit 1 when there is any warning (for CI)"
    )
    _output_flags(val)

    sim = sub.add_parser("sim", help="the deterministic fleet simulator")
    ssub = sim.add_subparsers(dest="sim", required=True, metavar="SUBCOMMAND")
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
    _output_flags(r)
    sw = ssub.add_parser("sweep", help="many seeds of every scenario: does the bound hold?")
    sw.add_argument("--seeds", type=int, default=20)
    sw.add_argument("--scenarios", help="comma-separated (default: all but scale)")
    sw.add_argument("--strategies", default="mesh", help="comma-separated (default: mesh)")
    sw.add_argument("--json", action="store_true")

    bench = sub.add_parser("bench", help="benchmarks of the real code (JSON on stdout)")
    bsub = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    hot = bsub.add_parser("hotpath", help="try_admit vs the limits package, in process")
    hot.add_argument("--ops", type=int, default=2_000_000)
    hot.add_argument("--keys", type=int, default=10_000)
    _output_flags(hot)
    owner = bsub.add_parser("owner", help="key-deltas one owner applies per second")
    owner.add_argument("--seconds", type=float, default=5.0)
    owner.add_argument("--feeders", type=int, default=2)
    owner.add_argument("--keys", type=int, default=10_000)
    owner.add_argument("--batch", type=int, default=256)
    _output_flags(owner)
    cluster = bsub.add_parser("cluster", help="a real cluster on loopback: d, excess")
    cluster.add_argument("--workers", type=int, default=4)
    cluster.add_argument("--seconds", type=float, default=5.0)
    cluster.add_argument("--keys", type=int, default=10_000)
    _output_flags(cluster)
    churn = bsub.add_parser("churn", help="new tenants touched once, then idle: RSS, /metrics")
    churn.add_argument("--tenants", type=int, default=250_000)
    churn.add_argument("--idle-seconds", dest="idle_seconds", type=float, default=3.0)
    churn.add_argument("--top-k", dest="top_k", type=int, default=50)
    churn.add_argument("--waves", type=int, default=1, help="waves of new tenants, each then idle")
    _output_flags(churn)
    flood = bsub.add_parser(
        "flood", help="try_admit latency while a ring member sends the largest batches"
    )
    flood.add_argument("--seconds", type=float, default=3.0)
    flood.add_argument("--batch-keys", dest="batch_keys", type=int, default=256)
    _output_flags(flood)
    pol = bsub.add_parser(
        "policy", help="push policy generations to real nodes: time until all enforce them"
    )
    pol.add_argument("--nodes", type=int, default=4)
    pol.add_argument("--pushes", type=int, default=100)
    pol.add_argument(
        "--in-process",
        dest="in_process",
        action="store_true",
        help="push to an in-memory coordinator in this process instead of a governord",
    )
    _output_flags(pol)
    st = bsub.add_parser(
        "strict",
        help="strict limits on real workers and governord (SIGKILLed once, a lossy link): "
        "max_excess, utilisation, governor calls",
    )
    st.add_argument(
        "--workers", default=None, help="worker processes (default 4); with --sweep a list (4,8)"
    )
    st.add_argument("--threads", type=int, default=4, help="asking threads per worker")
    st.add_argument(
        "--seconds", type=float, default=None, help="the run (default 10), or each sweep row (3)"
    )
    st.add_argument(
        "--offered-x",
        dest="offered_x",
        type=float,
        default=None,
        help="asks, as a multiple of R (default 5; 3 with --sweep)",
    )
    st.add_argument(
        "--sweep",
        action="store_true",
        help="rows over B/R, workers and one-way delay to governord (no kill): "
        "utilisation and max_excess per row",
    )
    st.add_argument(
        "--b-over-r",
        dest="b_over_r",
        default=None,
        help="with --sweep: B/R values in seconds (default 0.05,0.1,0.5,2)",
    )
    st.add_argument(
        "--delay-ms",
        dest="delay_ms",
        default=None,
        help="with --sweep: one-way delays to governord in ms (default 0,5,20,50)",
    )
    st.add_argument(
        "--credit",
        default=None,
        help="with --sweep: the workers' strict credit section as YAML, e.g. "
        "'{lead_ms: 20, horizon_ms: 100}' (default: none, the defaults)",
    )
    st.add_argument(
        "--mode",
        choices=("strict", "global"),
        default="strict",
        help="the limit under load: strict (credit from governord) or global (the mesh "
        "alone, the same R and B), to compare",
    )
    _output_flags(st)
    sc = bsub.add_parser(
        "sidecar",
        help="a real mesh node's sidecar API from client processes on this host: "
        "batched gRPC admissions/s, HTTP requests/s, p99s",
    )
    sc.add_argument("--runs", type=int, default=3)
    sc.add_argument("--seconds", type=float, default=3.0, help="per front end, per run")
    sc.add_argument("--batch", type=int, default=100, help="items per gRPC Admit call")
    sc.add_argument("--clients", type=int, default=1, help="client processes")
    sc.add_argument("--streams", type=int, default=8, help="gRPC calls in flight per client")
    sc.add_argument(
        "--connections", type=int, default=8, help="HTTP keep-alive connections per client"
    )
    _output_flags(sc)
    rd = bsub.add_parser(
        "redis",
        help="redis mode on real workers against a redis-server it starts: exact while it "
        "answers, then frozen (SIGSTOP), gone (SIGKILL) and back",
    )
    rd.add_argument("--workers", type=int, default=4)
    rd.add_argument(
        "--seconds",
        type=float,
        default=4.0,
        help="up, frozen and down together (half, a quarter, a quarter); the breaker's "
        "recovery adds about 5 s",
    )
    _output_flags(rd)
    su = bsub.add_parser(
        "suite",
        help="hotpath, owner, cluster (4 workers) and sidecar beside a calibration loop, "
        "each figure's ratio to it against a baseline: regressions",
    )
    su.add_argument(
        "--baseline", metavar="PATH", help="the baseline to compare with (bench/baseline.json)"
    )
    su.add_argument(
        "--write-baseline",
        dest="write_baseline",
        action="store_true",
        help="refresh the baseline with the figures that improved",
    )
    su.add_argument(
        "--force", action="store_true", help="with --write-baseline: write every figure"
    )
    su.add_argument("--quick", action="store_true", help="short runs (about a minute)")
    su.add_argument("--runs", type=int, default=1, help="passes; each figure is their median")
    su.add_argument(
        "--fail-on-regression",
        dest="fail_on_regression",
        action="store_true",
        help="exit 1 when a figure regressed",
    )
    _output_flags(su)
    _policy.add_parser(sub)
    _fleet.add_parser(sub)
    return p


def command_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The key of `args` in COMMANDS: the command, then its subcommand if it has any."""
    sub = (
        getattr(args, args.command, None)
        if args.command in ("sim", "bench", "policy", "fleet")
        else None
    )
    return (args.command,) if sub is None else (args.command, sub)


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's C core logs connection news (a peer's GOAWAY as the members stop) at INFO on
    # stderr; the commands speak for themselves, so only its errors, unless the operator
    # asked for more (set before grpc is first imported: no command has imported it yet).
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = _parser().parse_args(argv)
    key = command_of(args)
    try:
        if key[0] in _checkout.TOOLS:
            _checkout.require(key[0])
        return COMMANDS[key](args)
    except ConfigError as exc:  # the operator's mistake: one line naming the field or file
        print(f"mesh {' '.join(key)}: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout closed early (`mesh sim run | head`): nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as Python's docs
        return 1  # advise, so the interpreter's final flush does not raise again

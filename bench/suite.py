"""`mesh bench suite`: the headline benches beside a calibration loop, against a baseline.

Machines (and one machine under different loads) differ by 2x and more, so a figure is read
as its ratio to a bare dict-keyed GCRA loop measured in the same process just before its bench
(`calibration_loop`, the loop `perfcheck` times). The ratios are compared with the ones
committed in `bench/baseline.json`; a figure more than `TOLERANCE` worse than its baseline
ratio is a regression. Each figure states its orientation (`higher_is_better`) and how its
ratio is formed (`scale`):

* `per_calibration`: a rate, divided by the calibration (higher is better);
* `calibration_ops`: a time, as the number of calibration steps that fit in it (lower is
  better; a faster machine shortens the time and raises the calibration alike);
* `absolute`: a figure the machine's speed does not move (bytes, a bound, a yes/no), as is.

A figure of a bench that runs several processes at once (owner, cluster, sidecar) is formed
with a *parallel* calibration instead (`calibrate_parallel`): the same loop in as many
processes as the bench keeps busy, run together, each one's rate, their median. A machine
shared with other work gives one process a core while it gives each of several a fraction of
one; a single loop (at 6M ops/s with a core to itself) does not see that the bench's four
workers each got a third of a core, so under load their latency figures were flagged as
regressions that the code had not made. The parallel loop falls with the share each process
gets, so the product (a time) or quotient (a rate) stays with the code. A baseline figure
measured with the other kind of calibration (its `scale` differs) is not compared: it is
reported as new until the baseline is written again.

The comparison, the baseline's reading and its refresh are pure functions of their inputs
(`compare`, `parse_baseline`, `refreshed`), so tests pin them without timing anything.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratemesh.errors import ConfigError
from ratemesh.operator import one_line

__all__ = [
    "DEFAULT_BASELINE",
    "FIGURES",
    "TOLERANCE",
    "Figure",
    "calibrate",
    "calibrate_parallel",
    "calibration_loop",
    "compare",
    "parse_baseline",
    "ratio_of",
    "refreshed",
    "run",
    "table",
]

DEFAULT_BASELINE = Path(__file__).with_name("baseline.json")
TOLERANCE = 0.15  # worse than the baseline ratio by more than this fraction: a regression
CALIBRATION_REPEATS = 3  # the calibration is the best of these (as perfcheck takes it)

PER_CALIBRATION = "per_calibration"
CALIBRATION_OPS = "calibration_ops"
PER_PARALLEL_CALIBRATION = "per_parallel_calibration"  # a rate of a multi-process bench
PARALLEL_CALIBRATION_OPS = "parallel_calibration_ops"  # a time of a multi-process bench
ABSOLUTE = "absolute"
# Processes each multi-process bench keeps busy at once (`calibrate_parallel`): the owner and
# its two feeders; the cluster's four workers; the sidecar's node and its two clients.
BENCH_PROCESSES = {"owner": 3, "cluster": 4, "sidecar": 3}

Value = float | int | bool | None
Progress = Callable[[str], None]


def calibration_loop(seconds: float = 1.0) -> float:
    """GCRA steps per second of a minimal pure-Python loop over 10,000 dict keys.

    The same loop `perfcheck` runs inline: keep the two identical, so its `calib` and this
    suite's `calibration_ops_per_s` are one measure.
    """
    tat: dict[int, int] = {}
    T, tau, now, n = 500_000, 20_000_000, 0, 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for i in range(1000):
            k = i % 10_000
            now += 100
            v = tat.get(k, now)
            nt = (v if v > now else now) + T
            if nt - tau <= now:
                tat[k] = nt
            n += 1
    return n / seconds


def calibrate(seconds: float = 1.0, repeats: int = CALIBRATION_REPEATS) -> float:
    """The best of `repeats` loops: the machine's speed with the least of its load."""
    return max(calibration_loop(seconds) for _ in range(repeats))


def calibrate_parallel(processes: int, seconds: float = 1.0) -> float:
    """`calibration_loop` in `processes` processes at once: the median of their rates, what
    one process of a bench that keeps that many busy gets of the machine now."""
    if processes <= 1:
        return calibrate(seconds)
    ctx = multiprocessing.get_context("spawn")  # no copy of the parent's threads or locks
    with ctx.Pool(processes) as pool:
        rates = pool.map(calibration_loop, [seconds] * processes)
    return statistics.median(rates)


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure the suite tracks: where a bench's JSON holds it and which way is better."""

    name: str
    bench: str
    path: tuple[str, ...]
    higher_is_better: bool
    scale: str
    unit_s: float = 1.0  # for a time (`calibration_ops`): seconds per unit of the value


FIGURES: tuple[Figure, ...] = (
    Figure(
        "hotpath.hot_key_ops_per_s", "hotpath", ("mesh.hot_key", "ops_per_s"), True, PER_CALIBRATION
    ),
    Figure(
        "hotpath.many_keys_ops_per_s",
        "hotpath",
        ("mesh.many_keys", "ops_per_s"),
        True,
        PER_CALIBRATION,
    ),
    Figure("hotpath.bytes_per_key", "hotpath", ("bytes_per_key",), False, ABSOLUTE),
    Figure("owner.deltas_per_s", "owner", ("deltas_per_s",), True, PER_PARALLEL_CALIBRATION),
    Figure("cluster.d_p99_ms", "cluster", ("d_p99_ms",), False, PARALLEL_CALIBRATION_OPS, 1e-3),
    Figure(
        "cluster.tick_lag_max_ms",
        "cluster",
        ("tick_lag_max_ms",),
        False,
        PARALLEL_CALIBRATION_OPS,
        1e-3,
    ),
    Figure("cluster.bound", "cluster", ("bound",), False, ABSOLUTE),
    Figure("cluster.within_bound", "cluster", ("within_bound",), True, ABSOLUTE),
    Figure(
        "sidecar.grpc_admits_per_s",
        "sidecar",
        ("grpc_admits_per_s",),
        True,
        PER_PARALLEL_CALIBRATION,
    ),
    Figure(
        "sidecar.http_requests_per_s",
        "sidecar",
        ("http_requests_per_s",),
        True,
        PER_PARALLEL_CALIBRATION,
    ),
    Figure(
        "sidecar.grpc_p99_us", "sidecar", ("grpc_p99_us",), False, PARALLEL_CALIBRATION_OPS, 1e-6
    ),
    Figure(
        "sidecar.http_p99_us", "sidecar", ("http_p99_us",), False, PARALLEL_CALIBRATION_OPS, 1e-6
    ),
)
BY_NAME = {f.name: f for f in FIGURES}


def ratio_of(fig: Figure, value: Value, calibration: float) -> float | None:
    """The figure as the suite compares it (see the module docstring for each scale)."""
    if value is None:
        return None
    if fig.scale in (PER_CALIBRATION, PER_PARALLEL_CALIBRATION):
        return float(value) / calibration
    if fig.scale in (CALIBRATION_OPS, PARALLEL_CALIBRATION_OPS):
        return float(value) * fig.unit_s * calibration
    return float(value)


def parallel(fig: Figure) -> bool:
    """Whether the figure is formed with the parallel calibration of its bench."""
    return fig.scale in (PER_PARALLEL_CALIBRATION, PARALLEL_CALIBRATION_OPS)


def comparable(fig: Figure, entry: Mapping[str, Any]) -> bool:
    """Whether a baseline entry was formed the way the figure is now (an entry without a
    `scale` is taken as formed so): a ratio to another calibration says nothing of it."""
    return bool(entry.get("scale", fig.scale) == fig.scale)


def is_worse(fig: Figure, ratio: float, baseline_ratio: float) -> bool:
    """More than TOLERANCE worse than the baseline, in the figure's own direction."""
    if fig.higher_is_better:
        return ratio < baseline_ratio * (1 - TOLERANCE)
    return ratio > baseline_ratio * (1 + TOLERANCE)


def is_better(fig: Figure, ratio: float, baseline_ratio: float) -> bool:
    return ratio > baseline_ratio if fig.higher_is_better else ratio < baseline_ratio


# -- the baseline file ------------------------------------------------------------------------


def parse_baseline(text: str, path: Path) -> dict[str, Any]:
    """The baseline document, checked: a malformed one is a ConfigError naming the file."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(str(path), f"not JSON: {one_line(exc)}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("figures"), dict):
        raise ConfigError(str(path), 'must be a JSON object with a "figures" object')
    for name, entry in doc["figures"].items():
        ratio = entry.get("ratio") if isinstance(entry, dict) else None
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not ratio >= 0:
            raise ConfigError(str(path), f'figures.{name}: needs a "ratio" number >= 0')
        fig = BY_NAME.get(name)
        if fig is not None and entry.get("higher_is_better", fig.higher_is_better) is not (
            fig.higher_is_better
        ):
            raise ConfigError(
                str(path), f"figures.{name}: higher_is_better must be {fig.higher_is_better}"
            )
    return doc


def load_baseline(path: Path, *, missing_ok: bool) -> dict[str, Any] | None:
    """The baseline at `path`; None when it does not exist and `missing_ok`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return None
        raise ConfigError(str(path), "no such baseline (write one with --write-baseline)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"unreadable: {one_line(exc)}") from exc
    return parse_baseline(text, path)


def refreshed(
    baseline: Mapping[str, Any] | None,
    figures: Mapping[str, Mapping[str, Any]],
    meta: Mapping[str, Any],
    *,
    force: bool,
) -> tuple[dict[str, Any], list[str]]:
    """The baseline with the figures this run improved (or every measured one, with `force`),
    and their names. A figure keeps the date and calibration it was measured with."""
    old = dict(baseline.get("figures", {})) if baseline else {}
    written = []
    for name, fig in figures.items():
        ratio = fig["ratio_to_calibration"]
        if ratio is None:
            continue
        known = old.get(name)
        if known is not None and not comparable(BY_NAME[name], known):
            known = None  # formed another way: this run's figure replaces it
        if force or known is None or is_better(BY_NAME[name], ratio, known["ratio"]):
            old[name] = {
                "value": fig["value"],
                "ratio": ratio,
                "higher_is_better": fig["higher_is_better"],
                "scale": fig["scale"],
                "measured": meta["measured"],
                "calibration_ops_per_s": meta["calibration_ops_per_s"],
            }
            written.append(name)
    doc = {**(baseline or {}), "figures": dict(sorted(old.items()))}
    if written:
        doc.update(meta)  # the machine and calibration of the latest write
    return doc, written


# -- the comparison ---------------------------------------------------------------------------


def compare(
    measured: Mapping[str, tuple[Value, float | None]], baseline: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`figures` (per figure: value, ratio, baseline ratio, regressed, orientation) and
    `regressions` for the measured (value, ratio) pairs against a parsed baseline.

    A figure the baseline lacks is new: nothing to regress from. A figure the baseline has
    but this run could not measure (its bench failed) is a regression: it hides one.
    """
    base = baseline.get("figures", {}) if baseline else {}
    figures: dict[str, Any] = {}
    for fig in FIGURES:
        value, ratio = measured.get(fig.name, (None, None))
        known = base.get(fig.name)
        if known is not None and not comparable(fig, known):
            known = None  # new as this run forms it: nothing to regress from
        base_ratio = None if known is None else float(known["ratio"])
        if base_ratio is None:
            regressed = False
        elif ratio is None:
            regressed = True
        else:
            regressed = is_worse(fig, ratio, base_ratio)
        figures[fig.name] = {
            "value": value,
            "ratio_to_calibration": None if ratio is None else float(f"{ratio:.6g}"),
            "baseline_ratio": base_ratio,
            "change": (
                None if ratio is None or not base_ratio else round(ratio / base_ratio - 1, 4)
            ),
            "regressed": regressed,
            "higher_is_better": fig.higher_is_better,
            "scale": fig.scale,
        }
    return {"figures": figures, "regressions": [n for n, f in figures.items() if f["regressed"]]}


def table(result: Mapping[str, Any]) -> str:
    """The result for a reader: one row a figure, its ratio beside the baseline's."""
    rows = [
        f"calibration {result['calibration_ops_per_s']:,} ops/s "
        f"(end of run {result['calibration_end_ops_per_s']:,}); tolerance "
        f"{TOLERANCE:.0%}; baseline {result['baseline']}",
        "calibration before each bench: "
        + ", ".join(f"{b} {c:,}" for b, c in result["calibration_by_bench_ops_per_s"].items()),
        "parallel calibration (each of n processes): "
        + ", ".join(
            f"{b} {c['ops_per_s']:,} x{c['processes']}"
            for b, c in result.get("parallel_calibration_by_bench_ops_per_s", {}).items()
        ),
        f"{'figure':<30} {'value':>14} {'ratio':>12} {'baseline':>12} {'change':>8}  better",
    ]
    for name, f in result["figures"].items():
        change = "" if f["change"] is None else f"{f['change']:+.1%}"
        rows.append(
            f"{name:<30} {_fmt(f['value']):>14} {_fmt(f['ratio_to_calibration']):>12} "
            f"{_fmt(f['baseline_ratio']):>12} {change:>8}  "
            f"{'higher' if f['higher_is_better'] else 'lower':<6}"
            f"{'  REGRESSED' if f['regressed'] else ''}".rstrip()
        )
    for bench, err in result["errors"].items():
        rows.append(f"{bench} failed: {err}")
    rows.append("regressions: " + (", ".join(result["regressions"]) or "none"))
    return "\n".join(rows)


def _fmt(x: Value) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:,.4g}" if abs(x) < 1000 else f"{x:,.0f}"


# -- running the benches ----------------------------------------------------------------------


def _benches(quick: bool) -> dict[str, Callable[[], dict[str, Any]]]:
    """Each bench through its own entry point; `quick` shortens runs, not their shape."""

    def hotpath() -> dict[str, Any]:
        from bench.hotpath import run

        return run(ops=200_000 if quick else 2_000_000)

    def owner() -> dict[str, Any]:
        from bench.owner import run

        return run(seconds=1.0 if quick else 5.0)

    def cluster() -> dict[str, Any]:
        from bench.cluster import run

        return run(workers=4, seconds=1.0 if quick else 5.0)

    def sidecar() -> dict[str, Any]:
        from bench.sidecar import run

        return run(runs=1, seconds=1.0) if quick else run()

    return {"hotpath": hotpath, "owner": owner, "cluster": cluster, "sidecar": sidecar}


def _dig(obj: Any, path: Sequence[str]) -> Value:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj if isinstance(obj, int | float | bool) else None


@dataclass(frozen=True, slots=True)
class Measured:
    """One pass over every bench: each bench's figures beside the calibration measured just
    before it (load that comes and goes during a pass moves both), and one after them all."""

    calibrations: dict[str, float]
    parallel_calibrations: dict[str, float]  # benches of several processes only
    calibration_end: float
    values: dict[str, Value]
    errors: dict[str, str]


def measure_once(*, quick: bool, progress: Progress, label: str = "") -> Measured:
    """Each bench in turn, each after a calibration loop; a last calibration at the end."""
    cal_s = 0.3 if quick else 1.0
    t0 = time.monotonic()
    calibrations: dict[str, float] = {}
    parallel_calibrations: dict[str, float] = {}
    values: dict[str, Value] = {}
    errors: dict[str, str] = {}
    for bench, fn in _benches(quick).items():
        progress(f"{label}calibration, then {bench} (elapsed {time.monotonic() - t0:.1f} s)")
        calibrations[bench] = calibrate(cal_s)
        if bench in BENCH_PROCESSES:
            parallel_calibrations[bench] = calibrate_parallel(BENCH_PROCESSES[bench], cal_s)
        try:
            out = fn()
        except Exception as exc:  # one failed bench must not hide the others' figures
            errors[bench] = one_line(f"{type(exc).__name__}: {exc}")
            out = {}
        values.update({f.name: _dig(out, f.path) for f in FIGURES if f.bench == bench})
    progress(f"{label}calibration again (elapsed {time.monotonic() - t0:.1f} s)")
    return Measured(calibrations, parallel_calibrations, calibrate(cal_s), values, errors)


def _median(xs: Sequence[float | int | bool | None]) -> Value:
    known = [x for x in xs if x is not None]
    if not known:
        return None
    if all(isinstance(x, bool) for x in known):
        return statistics.median(int(x) for x in known) >= 0.5
    return statistics.median(known)


def machine() -> dict[str, Any]:
    """What a baseline was measured on: the CPU model, its cores, the load at the start."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)}


def run(
    *,
    baseline_path: Path = DEFAULT_BASELINE,
    quick: bool = False,
    runs: int = 1,
    write: bool = False,
    force: bool = False,
    progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """Measure every figure (the median over `runs` passes), compare it with the baseline,
    and with `write` refresh the baseline with the figures that improved."""
    if force and not write:
        raise ConfigError("--force", "only with --write-baseline")
    if write and quick:
        raise ConfigError("--write-baseline", "not with --quick: a short run is no baseline")
    baseline = load_baseline(baseline_path, missing_ok=write)  # fail before minutes of runs
    env = machine()
    started = time.monotonic()
    passes = [
        measure_once(quick=quick, progress=progress, label=f"run {i + 1}/{runs}: ")
        for i in range(runs)
    ]
    env["load_1m_end"] = round(os.getloadavg()[0], 2)
    by_bench = {
        b: round(statistics.median(p.calibrations[b] for p in passes))
        for b in passes[0].calibrations
    }
    calibration = statistics.median(c for p in passes for c in p.calibrations.values())
    measured: dict[str, tuple[Value, float | None]] = {}
    for fig in FIGURES:
        vals = [p.values.get(fig.name) for p in passes]
        ratios = [
            ratio_of(
                fig,
                v,
                (p.parallel_calibrations if parallel(fig) else p.calibrations)[fig.bench],
            )
            for v, p in zip(vals, passes, strict=True)
        ]
        ratio = _median(ratios)
        measured[fig.name] = (_median(vals), None if ratio is None else float(ratio))
    out: dict[str, Any] = {
        "calibration_ops_per_s": round(calibration),
        "calibration_end_ops_per_s": round(statistics.median(p.calibration_end for p in passes)),
        "calibration_by_bench_ops_per_s": by_bench,
        "parallel_calibration_by_bench_ops_per_s": {
            b: {
                "processes": BENCH_PROCESSES[b],
                "ops_per_s": round(statistics.median(p.parallel_calibrations[b] for p in passes)),
            }
            for b in passes[0].parallel_calibrations
        },
        **compare(measured, baseline),
        "errors": {b: e for p in passes for b, e in p.errors.items()},
        "baseline": str(baseline_path),
        "tolerance": TOLERANCE,
        "quick": quick,
        "runs": runs,
        "machine": env,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    if write:
        meta = {
            "measured": datetime.date.today().isoformat(),
            "calibration_ops_per_s": out["calibration_ops_per_s"],
            "runs": runs,
            **env,
        }
        doc, out["baseline_written"] = refreshed(baseline, out["figures"], meta, force=force)
        baseline_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return out

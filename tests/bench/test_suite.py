"""`mesh bench suite`: the comparison with the baseline, its reading and its refresh, on given
figures (no timing), and one short end-to-end run that checks the keys only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.suite import (
    BENCH_PROCESSES,
    DEFAULT_BASELINE,
    FIGURES,
    TOLERANCE,
    Value,
    calibrate_parallel,
    compare,
    parallel,
    parse_baseline,
    ratio_of,
    refreshed,
)
from mesh.cli import main
from ratemesh.errors import ConfigError

BY_NAME = {f.name: f for f in FIGURES}
HOT = "hotpath.hot_key_ops_per_s"  # higher is better
D99 = "cluster.d_p99_ms"  # lower is better
WITHIN = "cluster.within_bound"


def baseline(**ratios: float) -> dict[str, Any]:
    return {"figures": {name.replace("__", "."): {"ratio": r} for name, r in ratios.items()}}


def measured(**ratios: float | None) -> dict[str, tuple[Value, float | None]]:
    return {name.replace("__", "."): (1, r) for name, r in ratios.items()}


def test_a_rate_that_fell_more_than_the_tolerance_is_a_regression() -> None:
    base = baseline(hotpath__hot_key_ops_per_s=0.4)
    fell = compare(measured(hotpath__hot_key_ops_per_s=0.4 * (1 - TOLERANCE) - 0.001), base)
    assert fell["figures"][HOT]["regressed"] is True
    assert fell["regressions"] == [HOT]
    within = compare(measured(hotpath__hot_key_ops_per_s=0.4 * (1 - TOLERANCE) + 0.001), base)
    assert within["figures"][HOT]["regressed"] is False
    assert within["regressions"] == []
    rose = compare(measured(hotpath__hot_key_ops_per_s=0.8), base)
    assert rose["figures"][HOT]["regressed"] is False
    assert rose["figures"][HOT]["change"] == 1.0


def test_a_time_that_grew_is_a_regression_and_one_that_fell_is_not() -> None:
    base = baseline(cluster__d_p99_ms=30_000.0)
    grew = compare(measured(cluster__d_p99_ms=30_000.0 * (1 + TOLERANCE) + 1), base)
    assert grew["figures"][D99]["regressed"] is True
    assert grew["figures"][D99]["higher_is_better"] is False
    fell = compare(measured(cluster__d_p99_ms=3_000.0), base)
    assert fell["figures"][D99]["regressed"] is False


def test_every_figure_states_its_orientation_and_scale() -> None:
    out = compare({}, None)["figures"]
    assert set(out) == set(BY_NAME)
    lower = {n for n, f in out.items() if f["higher_is_better"] is False}
    assert lower == {
        "hotpath.bytes_per_key",
        "cluster.d_p99_ms",
        "cluster.tick_lag_max_ms",
        "cluster.bound",
        "sidecar.grpc_p99_us",
        "sidecar.http_p99_us",
    }
    for f in out.values():
        assert set(f) >= {"value", "ratio_to_calibration", "baseline_ratio", "regressed", "scale"}


def test_ratios_are_oriented_to_the_calibration_by_scale() -> None:
    calib = 2_000_000.0
    assert ratio_of(BY_NAME[HOT], 1_000_000, calib) == 0.5
    # a time: how many calibration steps fit in it (a faster machine moves both alike)
    assert ratio_of(BY_NAME[D99], 5.0, calib) == pytest.approx(10_000.0)
    assert ratio_of(BY_NAME["sidecar.grpc_p99_us"], 500.0, calib) == pytest.approx(1_000.0)
    assert ratio_of(BY_NAME["hotpath.bytes_per_key"], 476.6, calib) == 476.6
    assert ratio_of(BY_NAME[WITHIN], False, calib) == 0.0
    assert ratio_of(BY_NAME[HOT], None, calib) is None


def test_a_figure_missing_from_the_baseline_is_new_not_a_regression() -> None:
    out = compare(measured(hotpath__hot_key_ops_per_s=0.1, cluster__d_p99_ms=9.0), baseline())
    for name in (HOT, D99):
        assert out["figures"][name]["baseline_ratio"] is None
        assert out["figures"][name]["regressed"] is False
        assert out["figures"][name]["change"] is None
    assert out["regressions"] == []


def test_a_figure_the_run_could_not_measure_is_a_regression_when_the_baseline_has_it() -> None:
    out = compare(measured(hotpath__hot_key_ops_per_s=None), baseline(hotpath__hot_key_ops_per_s=1))
    assert out["figures"][HOT]["regressed"] is True
    assert out["figures"][HOT]["ratio_to_calibration"] is None
    assert out["regressions"] == [HOT]


def test_leaving_the_bound_is_a_regression() -> None:
    out = compare(measured(cluster__within_bound=0.0), baseline(cluster__within_bound=1.0))
    assert out["regressions"] == [WITHIN]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("{not json", "not JSON"),
        ("[]", '"figures"'),
        ('{"figures": []}', '"figures"'),
        ('{"figures": {"cluster.bound": 3}}', "figures.cluster.bound"),
        ('{"figures": {"cluster.bound": {"value": 3}}}', "figures.cluster.bound"),
        ('{"figures": {"cluster.bound": {"ratio": true}}}', "figures.cluster.bound"),
        ('{"figures": {"cluster.bound": {"ratio": -1}}}', "figures.cluster.bound"),
        ('{"figures": {"cluster.bound": {"ratio": NaN}}}', "figures.cluster.bound"),
        (
            '{"figures": {"cluster.d_p99_ms": {"ratio": 1, "higher_is_better": true}}}',
            "higher_is_better",
        ),
    ],
)
def test_a_malformed_baseline_is_one_line_naming_the_file(text: str, names: str) -> None:
    path = Path("somewhere/baseline.json")
    with pytest.raises(ConfigError) as err:
        parse_baseline(text, path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ")
    assert names in msg and "\n" not in msg


def test_the_cli_refuses_a_malformed_baseline_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "baseline.json"
    bad.write_text('{"figures": {"owner.deltas_per_s": {}}}')
    assert main(["bench", "suite", "--baseline", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mesh bench suite: {bad}: ") and "\n" not in err


def _figures(**ratios: float | None) -> dict[str, dict[str, Any]]:
    return {
        name.replace("__", "."): {
            "value": 1,
            "ratio_to_calibration": r,
            "higher_is_better": BY_NAME[name.replace("__", ".")].higher_is_better,
            "scale": BY_NAME[name.replace("__", ".")].scale,
        }
        for name, r in ratios.items()
    }


META = {"measured": "2026-12-07", "calibration_ops_per_s": 3_000_000, "cpu": "x"}


def test_a_refresh_writes_only_the_figures_that_improved() -> None:
    old = {"cpu": "old", **baseline(hotpath__hot_key_ops_per_s=0.4, cluster__d_p99_ms=100.0)}
    new = _figures(
        hotpath__hot_key_ops_per_s=0.3,  # worse: kept
        cluster__d_p99_ms=50.0,  # better (lower): written
        owner__deltas_per_s=0.01,  # new: written
        sidecar__grpc_admits_per_s=None,  # not measured: never written
    )
    doc, written = refreshed(old, new, META, force=False)
    assert sorted(written) == [D99, "owner.deltas_per_s"]
    assert doc["figures"][HOT] == {"ratio": 0.4}
    assert doc["figures"][D99]["ratio"] == 50.0
    assert doc["figures"][D99]["measured"] == "2026-12-07"
    assert "sidecar.grpc_admits_per_s" not in doc["figures"]
    assert doc["cpu"] == "x"
    parse_baseline(json.dumps(doc), Path("b.json"))  # what it writes, it reads


def test_a_refresh_with_nothing_better_changes_nothing_and_force_writes_all() -> None:
    old = {"cpu": "old", **baseline(hotpath__hot_key_ops_per_s=0.4)}
    doc, written = refreshed(old, _figures(hotpath__hot_key_ops_per_s=0.3), META, force=False)
    assert written == [] and doc == old
    doc, written = refreshed(old, _figures(hotpath__hot_key_ops_per_s=0.3), META, force=True)
    assert written == [HOT] and doc["figures"][HOT]["ratio"] == 0.3 and doc["cpu"] == "x"


def test_the_committed_baseline_reads_and_holds_every_figure() -> None:
    doc = parse_baseline(DEFAULT_BASELINE.read_text(), DEFAULT_BASELINE)
    assert set(doc["figures"]) == set(BY_NAME)
    for key in ("measured", "cpu", "calibration_ops_per_s", "runs", "load_1m"):
        assert key in doc, key


@pytest.mark.slow
def test_mesh_bench_suite_quick_prints_the_contract_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through the command's parser, dispatch and output; the benches start their processes."""
    assert main(["bench", "suite", "--quick", "--json"]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out)
    assert isinstance(res["calibration_ops_per_s"], int)
    assert isinstance(res["regressions"], list)
    assert res["errors"] == {}
    assert set(res["figures"]) == set(BY_NAME)
    for name, fig in res["figures"].items():
        for key in ("value", "ratio_to_calibration", "baseline_ratio", "regressed"):
            assert key in fig, (name, key)
        assert isinstance(fig["higher_is_better"], bool)
    assert "hotpath (elapsed" in out.err and "sidecar (elapsed" in out.err  # progress lines


def test_the_figures_of_benches_of_several_processes_are_formed_with_the_parallel_loop() -> None:
    """A multi-process bench's figures follow the share of the machine each of its processes
    gets (`calibrate_parallel`); a single-process bench's follow one loop."""
    multi = {f.name for f in FIGURES if parallel(f)}
    assert multi == {
        f.name for f in FIGURES if f.bench in BENCH_PROCESSES and f.scale != "absolute"
    }
    assert {"cluster.d_p99_ms", "owner.deltas_per_s", "sidecar.grpc_p99_us"} <= multi
    assert not any(parallel(f) for f in FIGURES if f.bench == "hotpath")


def test_a_latency_under_load_is_no_regression_when_each_process_got_less() -> None:
    """Load that halves what each worker gets doubles its d p99 and halves the parallel
    calibration: the ratio (a time: multiplied) is unchanged, so nothing is flagged."""
    fig = BY_NAME[D99]
    quiet = ratio_of(fig, 5.0, 2_000_000.0)
    loaded = ratio_of(fig, 10.0, 1_000_000.0)
    assert quiet == loaded
    base = {"figures": {D99: {"ratio": quiet, "scale": fig.scale}}}
    assert compare({D99: (10.0, loaded)}, base)["regressions"] == []
    worse = ratio_of(fig, 10.0, 2_000_000.0)  # the code got slower: a regression
    assert compare({D99: (10.0, worse)}, base)["regressions"] == [D99]


def test_a_baseline_formed_with_the_other_calibration_is_not_compared_and_is_replaced() -> None:
    """A baseline ratio to a single loop says nothing of a ratio to the parallel one: new,
    not a regression, and a refresh writes this run's figure in its place."""
    base = {"figures": {D99: {"ratio": 1.0, "scale": "calibration_ops"}}}
    out = compare({D99: (9.0, 99_999.0)}, base)
    assert out["figures"][D99]["baseline_ratio"] is None
    assert out["regressions"] == []
    meta = {"measured": "2026-12-08", "calibration_ops_per_s": 1}
    doc, written = refreshed(base, out["figures"], meta, force=False)
    assert written == [D99]
    assert doc["figures"][D99]["scale"] == BY_NAME[D99].scale


def test_the_parallel_calibration_runs_the_loop_in_each_process() -> None:
    """Counts only (never speed): a positive rate from two processes and from one."""
    assert calibrate_parallel(2, 0.05) > 0
    assert calibrate_parallel(1, 0.05) > 0

"""The node benchmarks print the keys DESIGN.md lists (short runs: keys, not figures)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test runs the mesh command


def _run(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "bench", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert isinstance(res, dict)
    return res


def test_bench_owner_keys() -> None:
    res = _run("owner", "--seconds", "1", "--feeders", "1", "--keys", "500", "--batch", "100")
    assert isinstance(res["deltas_per_s"], int) and res["deltas_per_s"] > 0


def test_bench_cluster_keys() -> None:
    res = _run("cluster", "--workers", "2", "--seconds", "1", "--keys", "10")
    for key in (
        "d_p50_ms",
        "d_p99_ms",
        "admitted",
        "ideal",
        "excess",
        "bound",
        "within_bound",
        "messages_per_worker_s_1x",
        "messages_per_worker_s_10x",
        "hotpath_ops_per_s",
    ):
        assert key in res, key
    assert res["within_bound"] is True


def test_bench_churn_keys() -> None:
    res = _run("churn", "--tenants", "3000", "--idle-seconds", "3", "--waves", "2")
    for key in (
        "tenants",
        "rss_growth_mb",
        "rss_growth_by_wave_mb",
        "rss_peak_growth_mb",
        "metrics_bytes",
        "metrics_tenant_labels",
    ):
        assert key in res, key
    # What is left after the idle phase: counts, never RSS (that varies by machine).
    assert [res[k] for k in ("views", "reporter_gates", "owner_keys", "decision_entries")] == [
        0,
        0,
        0,
        0,
    ]
    assert isinstance(res["metrics_tenant_labels"], int) and res["metrics_tenant_labels"] <= 51
    waves = res["rss_growth_by_wave_mb"]
    assert isinstance(waves, list) and len(waves) == 2
    assert res["rss_growth_mb"] == waves[0]


def test_bench_flood_keys() -> None:
    res = _run("flood", "--seconds", "0.5", "--batch-keys", "256")
    for phase in ("baseline", "flood"):
        phase_res = res[phase]
        assert isinstance(phase_res, dict)
        for key in ("p50_us", "p99_us", "p999_us", "max_us", "calls_per_s"):
            assert key in phase_res, (phase, key)
    for key in (
        "target_p99_us",
        "within_target",
        "batches_received",
        "reports_sliced",
        "reports_shed",
        "deliver_hold_max_ms",
        "policy_fetches_max",
        "gc_pause_max_ms",
        "gc_collections",
    ):
        assert key in res, key
    assert isinstance(res["batches_received"], int) and res["batches_received"] >= 1
    assert isinstance(res["policy_fetches_max"], int) and res["policy_fetches_max"] <= 1024


def test_bench_policy_keys() -> None:
    res = _run("policy", "--nodes", "2", "--pushes", "5")
    for key in ("nodes", "pushes", "propagation_p50_ms", "propagation_p99_ms", "diverged_nodes"):
        assert key in res, key
    assert (res["nodes"], res["pushes"], res["diverged_nodes"], res["push_timeouts"]) == (
        2,
        5,
        0,
        0,
    )


def test_bench_strict_keys_and_the_envelope() -> None:
    """Four workers, governord SIGKILLed and restarted, a lossy link: the keys, and the
    guarantee over every interval of the recorded admissions (an invariant, not a speed)."""
    res = _run("strict", "--workers", "4", "--threads", "2", "--seconds", "3")
    for key in (
        "workers",
        "seconds",
        "admitted",
        "max_excess",
        "governord_restarts",
        "governor_calls_per_admitted",
        "utilisation",
        "strict_try_admit_ops_per_s",
        "global_try_admit_ops_per_s",
        "within_targets",
    ):
        assert key in res, key
    assert (res["workers"], res["governord_restarts"]) == (4, 1)
    assert isinstance(res["admitted"], int) and res["admitted"] > 0
    excess = res["max_excess"]
    assert isinstance(excess, float) and excess <= 0, res
    for key in ("strict_try_admit_ops_per_s", "global_try_admit_ops_per_s"):
        ops = res[key]
        assert isinstance(ops, int) and ops > 0, key
    assert res["mode"] == "strict"
    lossy = res["lossy_link_bytes"]
    assert isinstance(lossy, int) and lossy > 0, res  # one worker reached governord through it
    shares = res["per_worker_admitted"]
    assert isinstance(shares, list) and len(shares) == 4 and sum(shares) == res["admitted"]
    assert isinstance(res["ops_denied"], dict)


def test_bench_strict_in_global_mode_runs_the_same_fleet_on_a_global_limit() -> None:
    res = _run("strict", "--mode", "global", "--workers", "2", "--threads", "1", "--seconds", "2")
    assert (res["mode"], res["workers"], res["governor_calls"]) == ("global", 2, 0)
    shares = res["per_worker_admitted"]
    assert isinstance(res["admitted"], int) and res["admitted"] > 0
    assert isinstance(shares, list) and len(shares) == 2


def test_bench_strict_refuses_a_bad_flag_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "bench", "strict", "--workers", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "--workers" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "bench", "strict", "--mode", "local", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == "" and "--mode" in out.stderr


def test_bench_sidecar_keys_and_counts_add_up() -> None:
    res = _run(
        "sidecar", "--runs", "2", "--seconds", "0.3", "--batch", "7",
        "--clients", "2", "--streams", "2", "--connections", "2",
    )  # fmt: skip
    for key in (
        "grpc_admits_per_s",
        "grpc_unary_admits_per_s",
        "http_requests_per_s",
        "grpc_p99_us",
        "http_p99_us",
    ):
        value = res[key]
        assert isinstance(value, (int, float)) and value > 0, key
    assert (res["runs"], res["batch"], res["clients"]) == (2, 7, 2)
    calls, requests = res["grpc_calls"], res["http_requests"]
    assert isinstance(calls, int) and isinstance(requests, int) and requests > 0
    assert res["grpc_admissions"] == calls * 7 == res["grpc_allowed"]
    assert res["http_allowed"] == requests
    assert res["grpc_errors"] == res["http_errors"] == 0
    assert res["counts_match"] is True
    assert isinstance(res["per_run"], list) and len(res["per_run"]) == 2


def test_bench_sidecar_refuses_a_batch_over_items_max_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "bench", "sidecar", "--batch", "1001", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "--batch" in out.stderr

"""The governord console script: bench subcommands print one JSON object with the contract keys."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.governor._stores import pg_dsn

pytestmark = pytest.mark.slow  # every test runs the governord command


def _governord(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "governor.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(proc.stdout)
    assert isinstance(result, dict)
    return result


def test_bench_engine_json_keys() -> None:
    result = _governord("bench", "engine", "--json", "--ops", "2000")
    assert {"consume_per_s", "acquire_release_per_s"} <= set(result)
    assert all(
        isinstance(result[k], int) and result[k] > 0
        for k in ("consume_per_s", "acquire_release_per_s")
    )


STORE_KEYS = {
    "durable_events_per_s",
    "single_writer_latency_ms",
    "raw_commit_per_s",
    "group_commit_gain",
}


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_bench_store_json_keys(store: str) -> None:
    extra = ["--dsn", pg_dsn()] if store == "postgres" else []
    result = _governord(
        "bench", "store", "--store", store, "--json", "--duration", "0.3", "--writers", "4", *extra
    )
    assert STORE_KEYS <= set(result)
    assert result["store"] == store


def test_validate_a_missing_file_names_it() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "governor.cli", "validate", "--config", "x.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "cannot read x.yaml" in proc.stderr, proc.stderr


def test_bench_scenarios_json_keys() -> None:
    result = _governord(
        "bench", "scenarios", "--json", "--quick", "--only", "retry_storm,dead_worker"
    )
    assert result["retry_storm"]["without"]["requests_per_call"] == 27
    assert result["retry_storm"]["with"]["requests_per_call"] == 2
    dead = result["dead_worker"]["with"]
    assert isinstance(dead, dict)
    assert dead["late_releases_refused"] == dead["leases_held"] == 4
    assert dead["pool_usable_after_ms"] <= dead["ttl_ms"] + 1000  # generous: shared CI cores


FAILOVER_KEYS = {
    "failovers",
    "takeover_p50_ms",
    "takeover_p99_ms",
    "acked_lost",
    "fencing_ids_reused",
    "linearizability_violations",
    "strict_max_excess",
}


@pytest.mark.postgres
def test_bench_failover_json_keys_and_its_safety_figures() -> None:
    """A short run (3 failovers, one a pause past the lease): the safety figures hold; the
    speed figures are reported, never asserted."""
    result = _governord(
        "bench", "failover", "--json", "--failovers", "3", "--callers", "4", "--pause-every", "3",
        "--dsn", pg_dsn(),
    )  # fmt: skip
    assert FAILOVER_KEYS <= set(result)
    assert result["failovers"] == 3 and result["paused_failovers"] == 1
    assert result["acked_lost"] == 0
    assert result["fencing_ids_reused"] == 0
    assert result["linearizability_violations"] == 0, result["linearizability_explained"]
    assert result["linearizability_verdict"] == "ok"
    assert result["strict_max_excess"] <= 0

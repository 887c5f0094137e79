"""Shared test settings: hypothesis runs derandomized (a seed decides every example, so a
failure replays), with no per-example deadline (CI machines are small and shared)."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# RATEMESH_CHECK_SLOW=<seconds> (e.g. 1): a test not marked `slow` fails when its call took
# longer than that, or when it (or its fixtures) started a process. Off by default, so a loaded
# CI machine does not turn timing into flakiness; run it to find tests that need the mark.
_CHECK_SLOW_S = float(os.environ.get("RATEMESH_CHECK_SLOW") or 0)
_popen_calls = 0

if _CHECK_SLOW_S:
    import subprocess

    _popen_init = subprocess.Popen.__init__

    def _counting_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        global _popen_calls
        _popen_calls += 1
        _popen_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = _counting_init  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[_POPEN_BEFORE] = _popen_calls
    yield


_POPEN_BEFORE = pytest.StashKey[int]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not _CHECK_SLOW_S or report.when != "call" or not report.passed:
        return
    if item.get_closest_marker("slow") is not None:
        return
    started = _popen_calls - item.stash.get(_POPEN_BEFORE, _popen_calls)
    if report.duration > _CHECK_SLOW_S or started:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: not marked slow, but took {report.duration:.2f} s "
            f"(limit {_CHECK_SLOW_S:g} s) and started {started} process(es)"
        )

"""Every constructor refuses wrong types, negative numbers and huge values, naming the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mesh.core.admission import Admission
from mesh.core.config import CoreConfig
from mesh.core.owner import Owner
from mesh.core.policy import PolicyCache
from mesh.core.reporter import Reporter
from mesh.core.ring import Ring
from mesh.errors import ConfigError, ConfigTypeError

RING = Ring(["a"], 1)


@pytest.mark.parametrize(
    "build, field, exc",
    [
        (lambda: Reporter("", 1, RING), "worker_id", ConfigError),
        (lambda: Reporter("w", -1, RING), "worker_epoch", ConfigError),
        (
            lambda: Reporter("w", 1.0, RING),  # type: ignore[arg-type]  # wrong type on purpose
            "worker_epoch",
            ConfigTypeError,
        ),
        (
            lambda: Reporter("w", 1, ["a"]),  # type: ignore[arg-type]  # wrong type on purpose
            "ring",
            ConfigTypeError,
        ),
        (
            lambda: Owner("o", RING, {}, 0),  # type: ignore[arg-type]  # wrong type on purpose
            "policies",
            ConfigTypeError,
        ),
        (lambda: Owner("o", RING, PolicyCache(), -5), "now_ns", ConfigError),
        (lambda: Owner("o", RING, PolicyCache(), 0, incarnation=2**70), "incarnation", ConfigError),
        (
            lambda: Owner(None, RING, PolicyCache(), 0),  # type: ignore[arg-type]  # wrong type on purpose
            "member_id",
            ConfigTypeError,
        ),
        (
            lambda: Admission([], 0),  # type: ignore[arg-type]  # wrong type on purpose
            "policies",
            ConfigTypeError,
        ),
        (lambda: Admission(PolicyCache(), 0, n_live=0), "n_live", ConfigError),
        (lambda: CoreConfig(sync_interval_ms=0), "sync_interval_ms", ConfigError),
        (
            lambda: CoreConfig(snapshot_ttl_ms="20"),  # type: ignore[arg-type]  # wrong type on purpose
            "snapshot_ttl_ms",
            ConfigTypeError,
        ),
        (
            lambda: CoreConfig(sync_interval_ms=10, snapshot_ttl_ms=5),
            "snapshot_ttl_ms",
            ConfigError,
        ),
        (lambda: CoreConfig.from_dict({"sync_interval": 5}), "core.sync_interval", ConfigError),
        (
            lambda: CoreConfig.from_dict({"tenant_queue_max": -1}),
            "core.tenant_queue_max",
            ConfigError,
        ),
        (
            lambda: CoreConfig.from_dict({"tenant_queue_max": 1.5}),
            "core.tenant_queue_max",
            ConfigTypeError,
        ),
        (lambda: PolicyCache(generations_kept=0), "generations_kept", ConfigError),
    ],
)
def test_bad_constructor_arguments_name_the_field(
    build: Callable[[], Any], field: str, exc: type[ConfigError]
) -> None:
    with pytest.raises(exc) as info:
        build()
    assert info.value.field == field
    assert field in str(info.value)


def test_config_defaults_are_the_seeds() -> None:
    c = CoreConfig()
    assert (
        c.sync_interval_ms,
        c.snapshot_ttl_ms,
        c.report_threshold_units,
        c.report_threshold_bytes,
        c.tenant_queue_max,
    ) == (5, 20, 32, 64 * 1024, 1024)
    assert CoreConfig.from_dict(None) == c
    assert CoreConfig.from_dict({"sync_interval_ms": 2}).sync_interval_ms == 2

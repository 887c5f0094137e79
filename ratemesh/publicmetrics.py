"""What /metrics shows a caller who may not see tenant detail (off loopback, without the
operator's or pages token; docs/security.md): every family of a registry but those labelled
by tenant. One view for both daemons, and the families both export beside their own: the
process's (`process_*`: CPU, memory, open files, start time) and `ratemesh_build_info`."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["public_registry", "register_standard", "version"]


def version() -> str:
    """The installed ratemesh's version ("unknown" when run from a tree not installed)."""
    try:
        return metadata.version("ratemesh")
    except metadata.PackageNotFoundError:
        return "unknown"


class _BuildInfo(Collector):
    def __init__(self, component: str) -> None:
        self._labels = [version(), component, platform.python_version()]

    def collect(self) -> Iterator[Any]:
        fam = GaugeMetricFamily(
            "ratemesh_build_info",
            "Always 1: the version, the daemon (node or governord) and the Python it runs on, "
            "to join on (a rollout shows as two versions side by side)",
            labels=["version", "component", "python"],
        )
        fam.add_metric(self._labels, 1)
        yield fam


def register_standard(registry: CollectorRegistry, component: str) -> None:
    """Add the families every daemon exports to `registry`: `process_*` (Linux /proc; none
    elsewhere) and `ratemesh_build_info{version, component, python}`."""
    ProcessCollector(registry=registry)
    registry.register(_BuildInfo(component))


class _Untenanted(Collector):
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Any]:
        for family in self._registry.collect():
            # an empty family's name may still say "tenant": left out too
            if family.samples and not any("tenant" in s.labels for s in family.samples):
                yield family


def public_registry(registry: CollectorRegistry) -> CollectorRegistry:
    """A registry that collects `registry` without its tenant-labelled families."""
    public = CollectorRegistry(auto_describe=False)
    public.register(_Untenanted(registry))
    return public

"""What /metrics shows a caller who may not see tenant detail (off loopback, without the
operator's or pages token; docs/security.md): every family of a registry but those labelled
by tenant. One view for both daemons."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

__all__ = ["public_registry"]


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

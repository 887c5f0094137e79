"""The strategies the simulator compares, each behind `sim.strategies.base.Strategy`."""

from __future__ import annotations

from collections.abc import Callable

from sim.strategies.base import Context, Strategy
from sim.strategies.central import CentralStrategy
from sim.strategies.gubernator import GubernatorStrategy
from sim.strategies.local import LocalStrategy, ShareStrategy
from sim.strategies.mesh import MeshStrategy
from sim.strategies.strict import StrictStrategy

__all__ = ["Context", "Strategy", "make", "REGISTRY"]

REGISTRY: dict[str, Callable[[Context], Strategy]] = {
    "mesh": MeshStrategy,
    "local": LocalStrategy,
    "share": ShareStrategy,
    "gubernator-global": GubernatorStrategy,
    "central-open": lambda ctx: CentralStrategy(ctx, fail_open=True),
    "central-closed": lambda ctx: CentralStrategy(ctx, fail_open=False),
    "strict": StrictStrategy,
}


def make(name: str, ctx: Context) -> Strategy:
    return REGISTRY[name](ctx)

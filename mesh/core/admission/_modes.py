"""Which gate each admission mode opens: the one table a new mode is added to.

A mode is its gate class (a `mesh.core.gate.Gate` that answers `deny`, `refund`, `idle`,
`forget`, `deadline` for itself) and an opener here, in a module of its own; `Admission`
dispatches through both and names no mode (docs/architecture.md, "Adding a mode"). A
disabled policy and a spend quota are decided before the mode is looked at: they are kinds
of policy, not coordination modes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mesh.core.admission._gates import open_local, open_share
from mesh.core.admission._global import open_global
from mesh.core.admission._redis import open_redis
from mesh.core.admission._strict import open_strict
from mesh.core.gate import Gate
from mesh.core.policy import Mode, TenantRatePolicy

if TYPE_CHECKING:
    from mesh.core.admission._admission import Admission

__all__ = ["OPENERS", "Opener"]

Opener = Callable[["Admission", TenantRatePolicy], Gate]

OPENERS: dict[Mode, Opener] = {
    Mode.LOCAL: open_local,
    Mode.SHARE: open_share,
    Mode.GLOBAL: open_global,
    Mode.STRICT: open_strict,
    Mode.REDIS: open_redis,
}

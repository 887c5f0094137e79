"""`slot()` that fails open at the import level (seed 003): the drop-in for code that must
run exactly as before when the governor cannot load or reach anything.

    from governor.slot import slot
    with slot("model", max=2, priority="high"):
        run_the_model()

Loading this module loads only the standard library and `governor.gov` (the machine-local
semaphore: no grpc). `slot()` loads the SDK's slot (`governor.client.slot`: governord
leases, the machine's semaphore, cooldowns) when it is called; when that cannot load (grpc
or another dependency missing or broken) or cannot set up (no usable state directory), the
block runs without a slot and one line on stderr says so and why. A mistake in the
arguments (a bad name, `max` out of range) still raises: that is the caller's bug.
"""

from __future__ import annotations

from typing import Any

from governor.gov import FailOpen

__all__ = ["slot"]


def slot(name: str = "default", **kwargs: Any) -> Any:
    """`governor.client.slot(name, **kwargs)`, or a `FailOpen` block when the SDK cannot
    load (module docstring)."""
    try:
        from governor.client import slot as governed
    except Exception as exc:  # noqa: BLE001 - any failure to load is an outage here
        return FailOpen(name, f"the governor could not load ({type(exc).__name__}: {exc})")
    return governed(name, **kwargs)

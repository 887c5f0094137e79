"""The per-(tenant, metric) state the hot path touches, shared by every mode.

`try_admit` reads and writes only these slots: `avail` (what may still be admitted now),
`pending` (admitted, not yet accounted), `denied`, and the threshold `flush_at` at which the
view's `sink` is told (a mode's bookkeeping happens there, off the hot path). Mode-specific
state lives in subclasses.
"""

from __future__ import annotations

from collections.abc import Callable

from mesh.core.policy import BOUNDS, Mode, TenantRatePolicy
from mesh.core.verdict import Reason, Suspension, Verdict, verdict

__all__ = ["Gate", "NEVER"]

NEVER = 1 << 62  # a threshold that is never crossed


class Gate:
    __slots__ = ("avail", "pending", "denied", "flush_at", "sink", "ok", "no", "policy", "marked")

    def __init__(self, policy: TenantRatePolicy, sink: Callable[[Gate], None]) -> None:
        self.policy = policy
        self.avail = 0
        self.pending = 0
        self.denied = 0
        self.flush_at = 1  # the first admission after a flush tells the sink
        self.sink = sink
        self.marked = False
        self.ok: Verdict = verdict(True, Reason.ADMITTED, policy.mode, BOUNDS[policy.mode])
        self.no: Verdict = verdict(False, Reason.RATE_LIMITED, policy.mode, BOUNDS[policy.mode])

    def set_verdicts(
        self,
        bound: str,
        suspended: Suspension | None = None,
        deny_reason: Reason = Reason.RATE_LIMITED,
    ) -> None:
        """Swap the shared verdicts when the view's condition changes (off the hot path)."""
        mode: Mode = self.policy.mode
        self.ok = verdict(True, Reason.ADMITTED, mode, bound, suspended)
        self.no = verdict(False, deny_reason, mode, bound, suspended)

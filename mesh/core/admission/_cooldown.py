"""A view cooling down after a 429 (docs/cooldown.md): it admits nothing until
`until_ns`, and every verdict says so (`suspended: cooldown`, reason `cooldown`), with the
time left as `retry_after_ms` on the detailed forms.

It wraps the view it stands in for (`inner`), which keeps its state (reports in flight, a
meter) and is put back at the first tick past `until_ns`. Swapping the view rather than
testing a flag keeps the hot path as it is: `try_admit` finds `avail` 0 and takes `no`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.core.gate import NEVER, Gate
from mesh.core.policy import BOUNDS
from mesh.core.verdict import NS_PER_MS, Numbers, Reason, Step, Suspension, ms_ceil

if TYPE_CHECKING:
    from mesh.core.admission._admission import Admission

__all__ = ["CooldownGate"]


def _ignore(v: Gate) -> None:
    v.flush_at = NEVER


class CooldownGate(Gate):
    __slots__ = ("inner", "until_ns")

    def __init__(self, inner: Gate, until_ns: int) -> None:
        super().__init__(inner.policy, _ignore)
        self.inner = inner
        self.until_ns = until_ns
        self.avail = 0
        self.flush_at = NEVER
        self.set_verdicts(BOUNDS["cooldown"], Suspension.COOLDOWN, Reason.COOLDOWN, step=Step.MESH)
        self.ok = self.no  # nothing is admitted while it lasts

    def numbers(self, amount: int, allowed: bool, now_ns: int) -> Numbers:
        left = max(0, self.until_ns - now_ns)
        return Numbers(0, max(1, ms_ceil(left)) if left else 1, ms_ceil(left))

    def refund(self, amount: int) -> None:
        """What was charged before the cooldown goes back as usual."""
        self.inner.refund(amount)

    def forget(self, admission: Admission, *, retire: bool) -> None:
        """The cooldown is the pair's, not the generation's: the view under it goes."""
        self.inner.forget(admission, retire=retire)

    def left_ms(self, now_ns: int) -> int:
        return max(0, self.until_ns - now_ns) // NS_PER_MS

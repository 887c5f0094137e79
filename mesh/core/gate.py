"""The per-(tenant, metric) state the hot path touches, shared by every mode.

`try_admit` reads and writes only these slots: `avail` (what may still be admitted now),
`pending` (admitted, not yet accounted), `denied`, and the threshold `flush_at` at which the
view's `sink` is told (a mode's bookkeeping happens there, off the hot path). The deny path
reads `largest`, the most one admission can ever take from the view. Mode-specific
state lives in subclasses, and so does each one's `numbers` (a detailed verdict's
remaining / retry_after_ms / reset_after_ms): one formula per gate type, with its state.

`avail`, `pending` and `denied` are in the caller's units. A policy whose rate is not whole
per second meters `scale` sub-units per unit (`TenantRatePolicy.scale`): its meters,
allowances and reports are in sub-units, and this is the one boundary that converts, so the
hot path stays what it was. A gate keeps `avail` as whole units (sub-units // scale, rounded
down: never more than is there) and multiplies `pending` and `denied` by `scale` where they
leave the view (a settle, a report); with scale 1 both are the identity.

Each mode's gate also answers for itself what `Admission` asks of any view off the hot path
(`deny`, `refund`, `idle`, `forget`, `deadline`, `detailed`, `health`): the defaults are a
plain metered view's, and a mode overrides what differs. Which gate a mode opens is
`mesh.core.admission._modes.OPENERS` (docs/architecture.md, "Adding a mode").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mesh.core.policy import BOUNDS, Mode, TenantRatePolicy
from mesh.core.verdict import Numbers, Reason, Step, Suspension, Verdict, verdict

if TYPE_CHECKING:
    from mesh.core.admission import Admission

__all__ = ["Gate", "NEVER", "STEPS"]

NEVER = 1 << 62  # a threshold that is never crossed
# The step a mode's view decides at (strict's veto is the mesh's: StrictGate.admit says so).
STEPS: dict[Mode, Step] = {
    Mode.LOCAL: Step.LOCAL,
    Mode.SHARE: Step.SHARE,
    Mode.GLOBAL: Step.MESH,
    Mode.STRICT: Step.STRICT,
    Mode.REDIS: Step.REDIS,
}


class Gate:
    __slots__ = (
        "avail",
        "pending",
        "denied",
        "flush_at",
        "sink",
        "ok",
        "no",
        "policy",
        "marked",
        "scale",
    )

    def __init__(self, policy: TenantRatePolicy, sink: Callable[[Gate], None]) -> None:
        self.policy = policy
        self.scale = policy.scale  # sub-units per unit (1: a whole rate per second)
        self.avail = 0
        self.pending = 0
        self.denied = 0
        self.flush_at = 1  # the first admission after a flush tells the sink
        self.sink = sink
        self.marked = False
        self.set_verdicts(BOUNDS[policy.mode])

    def set_verdicts(
        self,
        bound: str,
        suspended: Suspension | None = None,
        deny_reason: Reason = Reason.RATE_LIMITED,
        *,
        limited: bool = True,
        step: Step | None = None,
    ) -> None:
        """Swap the shared verdicts when the view's condition changes (off the hot path).
        They carry the policy's rate in units per second (`limit_per_s`) as `limit` unless
        not `limited` (disabled), and `step` or else the mode's (STEPS)."""
        p = self.policy
        mode: Mode = p.mode
        rate = p.limit_per_s if limited else None
        s = STEPS[mode] if step is None else step
        sh = p.shadow  # shadow posture: `ok` says so; `no` is shadowed where it is given
        self.ok = verdict(
            True, Reason.ADMITTED, mode, bound, suspended, limit=rate, step=s, shadow=sh
        )
        self.no = verdict(False, deny_reason, mode, bound, suspended, limit=rate, step=s, shadow=sh)

    # A view that holds at most b (a global view), not B: `largest` says so (class-wide).
    HOLDS_B_AT_MOST = False

    @property
    def largest(self) -> int:
        """The largest amount one admission can ever take here (units): a larger one is
        `too_large`, whose retry_after_ms is None, never `rate_limited` with a retry that
        cannot succeed. The limit's burst B, or b for a view that holds at most b; a view
        whose own varies (a share, strict credit) keeps it in a slot of its own, which
        takes the place of this property. Read on the deny path only."""
        p = self.policy
        return p.local_burst_cap // p.scale if self.HOLDS_B_AT_MOST else p.burst_units

    @largest.setter
    def largest(self, units: int) -> None:
        raise AttributeError(f"{type(self).__name__}'s largest amount follows its policy")

    def too_large(self) -> Verdict:
        """The answer to an amount above `largest`: no wait helps (retry_after_ms None)."""
        no = self.no
        return verdict(
            False, Reason.TOO_LARGE, self.policy.mode, no.bound, limit=no.limit, step=no.step
        )

    def numbers(self, amount: int, allowed: bool, now_ns: int) -> Numbers:
        """The per-moment numbers of a verdict just given for `amount` (`Verdict.with_numbers`):
        what the view could still admit, when `amount` could next fit (0 when allowed, None
        when waiting cannot help), when the view is full again (None: not known here).
        Each gate type overrides it with its own arithmetic; off the hot path."""
        return Numbers(max(self.avail, 0), 0 if allowed else None, None)

    # ---- what admission asks of a view, off the hot path ---------------------------------

    def deny(self, amount: int, admission: Admission) -> Verdict:
        """The answer when `amount` (a valid amount, within `largest`) found `avail` short:
        `no`, the denial counted (`denied`) for the sink to pass on. A mode whose view
        decides elsewhere (credit, a round trip, a ledger) answers from there."""
        self.denied += amount
        if not self.marked:
            self.sink(self)
        return self.no

    def refund(self, amount: int) -> None:
        """Give back `amount` units charged and not used (`Admission.refund`). Nothing, by
        default: a view that is spent, never refunded, keeps what it took."""

    def idle(self, admission: Admission) -> bool:
        """Whether the view holds nothing the idle sweep would lose by forgetting it (it is
        rebuilt on next use exactly as it would be now). No, unless a mode says so."""
        return False

    def forget(self, admission: Admission, *, retire: bool) -> None:
        """The view is dropped: by the idle sweep, or (`retire`) replaced by a new policy
        generation, whose old key keeps reporting until it drains. What it holds elsewhere
        (a credit block, a settle, a reporter's key) is let go here."""

    def deadline(self) -> Verdict | None:
        """A waiter's verdict at its deadline, when the view has more to say than the plain
        DEADLINE (a suspension that made it wait); None for the plain one."""
        return None

    def detailed(self, v: Verdict, n: Numbers) -> Verdict:
        """`v`, a verdict just given here, as a fresh verdict carrying its numbers `n`."""
        return v.with_numbers(n, self.ok.limit)

    def health(self) -> dict[str, object]:
        """What /health shows of the view beyond its bound and suspension: its mode's own
        state (read under the node's lock)."""
        return {}

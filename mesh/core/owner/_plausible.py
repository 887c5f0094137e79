"""Plausible usage only: what an owner takes from a sender, and what it refuses.

Anything a peer sends is untrusted, including its claimed identity and the size of its
numbers. An owner refuses:

* `NOT_MEMBER`: a report batch or a hand-over whose sender is neither in the owner's ring
  nor left it within `DEPARTED_GRACE_NS` (the rings before the current one, kept for the
  reports and hand-overs in flight while keys move). Refused whole: nothing it claims is
  trusted, nothing is created for it (no reporter record, no lease, no reply). Counted per
  message.
* `OVER_CLAIM`: a report (row) whose usage its sender could not have admitted under the key's
  policy. Per (sender, key) the owner runs a meter of the sender's claims at the key's rate
  R; a claim that would put it more than `claim_tolerance` ahead is refused. That is "the
  sender's claims never exceed R x elapsed + tolerance" over every interval since its record
  was created (the first report), not only since then: a sender idle for an hour cannot then
  claim an hour's worth at once. The tolerance is b + B + R x (snapshot_ttl +
  report_retry_max + 2 x sync_interval):
    - b, the local burst cap, and B, the global burst: one worker may spend the whole
      bucket (its snapshots tell it `remaining` as it goes) before its reports arrive, and
      the unacknowledged reports it carries from a previous owner reach a new owner at once;
    - R x that window: usage admitted before its first report here or held in flight: a
      view is spent for at most one TTL without news, a report waits up to one sync
      interval before it is sent, may be resent after `report_retry_max_ms`, and the
      owner's tick adds one more interval.
  An honest worker's usage over any interval stays within R x interval + B + b (the
  envelope's share of one worker); the rest is slack for timing.
* `OVER_REFUND`: a refund (negative delta) larger than the net usage of that sender this
  owner applied for the key. A refund after the key moved (or after the owner forgot the
  sender) is therefore refused: the new owner keeps the usage, which is the safe side.

* `BAD_WATERMARK`: a reporter's watermark a leaving owner handed over (`_handover`) that the
  reporter's own first report here does not bear out: of another incarnation than the
  reporter's, or past the most sequences it can have sent (`ReporterState.confirm`). The
  record then starts from the reporter's own word, as if the hand-over had not carried it.
  Counted per record.

Refused rows, not batches, for a member: a batch carries up to `report_batch_max` keys of one
worker, and its other keys' usage must still count (dropping it would let the fleet overshoot).
A refused row changes nothing the key's meter or anyone's share depends on (meter, applied
totals, the claim meter, demand); its sequence is recorded as seen and acknowledged like a
duplicate, so an honest worker (a refund after a move) stops resending it and its view does
not go stale. Every refusal is counted in `Owner.refused` by reason; the driver logs it with
the sender.
"""

from __future__ import annotations

from enum import StrEnum

from mesh.core.config import CoreConfig
from mesh.core.gcra import NS_PER_S
from mesh.core.owner._state import KeyState, ReporterState
from mesh.core.policy import TenantRatePolicy

__all__ = ["Refusal", "claim_tolerance", "claim", "ORDER_MAX"]

# A handed-over key's owner_epoch and version are taken up to this, not beyond: the owner adds
# one per snapshot, and a peer's INT_MAX would otherwise overflow the wire's range (a later
# snapshot or hand-over could not be encoded). Half the range lasts for millennia.
ORDER_MAX = (1 << 62) - 1


class Refusal(StrEnum):
    """Why an owner refused a peer's report or hand-over (`Owner.refused`, by value)."""

    NOT_MEMBER = "not_member"
    OVER_CLAIM = "over_claim"
    OVER_REFUND = "over_refund"
    BAD_WATERMARK = "bad_watermark"


def claim_tolerance(policy: TenantRatePolicy, config: CoreConfig) -> int:
    """How far ahead of the key's rate one sender's claims may run, scaled like a TAT
    (units x 1e9): b + B + R x (snapshot_ttl + report_retry_max + 2 x sync_interval)."""
    window_ns = (
        config.snapshot_ttl_ns
        + config.report_retry_max_ms * 1_000_000
        + 2 * config.sync_interval_ns
    )
    return (
        policy.local_burst_cap + policy.global_burst
    ) * NS_PER_S + policy.target_rate * window_ns


def claim(rs: ReporterState, ks: KeyState, now_ns: int, delta: int) -> Refusal | None:
    """Take `delta` (a new report's usage) into the sender's claim record, or say why not
    (and change nothing)."""
    now_s = now_ns * ks.policy.target_rate
    tat = rs.claim_tat if rs.claim_tat > now_s else now_s
    if delta > 0:
        tat += delta * NS_PER_S
        if tat - now_s > ks.claim_tol:
            return Refusal.OVER_CLAIM
    elif delta < 0:
        if -delta > rs.net:
            return Refusal.OVER_REFUND
        tat += delta * NS_PER_S  # a refund gives back what it claimed
    rs.claim_tat = tat
    rs.net += delta
    return None

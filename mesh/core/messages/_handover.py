"""Hand-over: a gracefully leaving owner's meter state, sent to each key's next owner.

Its own family because it is sent once, on leave, and carries what the report and snapshot
families never do: a meter's lead over the sender's clock and the reporters' idempotency
watermarks, each with its own bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh.core._validate import check_int, check_str
from mesh.core.messages._keys import HANDOVER_ROWS_MAX
from mesh.core.policy import RateKey
from mesh.errors import MessageError, MessageTypeError

__all__ = ["HANDOVER_WATERMARKS_MAX", "ReporterWatermark", "KeyHandover", "Handover"]

# Reporters' records per handed-over key: a key and its records fit one hand-over
# (HANDOVER_ROWS_MAX rows). A leaver carries its most recent reporters'; the others' resends
# count again at the new owner, which is the safe side.
HANDOVER_WATERMARKS_MAX = HANDOVER_ROWS_MAX - 1


@dataclass(frozen=True, slots=True)
class ReporterWatermark:
    """One reporter's idempotency record for a handed-over key: every sequence of
    `worker_epoch` up to `watermark` is already in the handed state, so a resend of one
    (its ack was lost) is a duplicate at the new owner, not new usage."""

    worker_id: str
    worker_epoch: int
    watermark: int

    def __post_init__(self) -> None:
        check_str("worker_id", self.worker_id, error=MessageError)
        check_int("worker_epoch", self.worker_epoch, error=MessageError)
        check_int("watermark", self.watermark, error=MessageError)


@dataclass(frozen=True, slots=True)
class KeyHandover:
    """One key's meter state, from a leaving owner to the key's next owner.

    `ahead_ns` is how far the key's TAT was ahead of the sender's clock when it was sent,
    rounded up (0: the bucket was full). Members' monotonic clocks differ, so no absolute
    time crosses the wire; time in transit is lost, which only makes the receiver stricter.
    """

    rate_key: RateKey
    ahead_ns: int
    owner_epoch: int
    version: int
    watermarks: tuple[ReporterWatermark, ...] = ()

    def __post_init__(self) -> None:
        if type(self.rate_key) is not RateKey:
            raise MessageTypeError("rate_key", "must be a RateKey")
        check_int("ahead_ns", self.ahead_ns, error=MessageError)
        check_int("owner_epoch", self.owner_epoch, error=MessageError)
        check_int("version", self.version, error=MessageError)
        if type(self.watermarks) is not tuple:
            raise MessageTypeError("watermarks", "must be a tuple of ReporterWatermark")
        if len(self.watermarks) > HANDOVER_WATERMARKS_MAX:
            raise MessageError(
                "watermarks",
                f"at most {HANDOVER_WATERMARKS_MAX} per key, got {len(self.watermarks)}",
            )
        seen: set[str] = set()
        for i, w in enumerate(self.watermarks):
            if not isinstance(w, ReporterWatermark):
                raise MessageTypeError(f"watermarks[{i}]", "must be a ReporterWatermark")
            if w.worker_id in seen:
                raise MessageError(f"watermarks[{i}].worker_id", f"{w.worker_id!r} repeated")
            seen.add(w.worker_id)


@dataclass(frozen=True, slots=True)
class Handover:
    """A gracefully leaving owner's keys for one next owner. `ring_epoch` is the
    ring the sender owned them in."""

    sender: str
    ring_epoch: int
    keys: tuple[KeyHandover, ...]

    def __post_init__(self) -> None:
        check_str("sender", self.sender, error=MessageError)
        check_int("ring_epoch", self.ring_epoch, error=MessageError)
        if type(self.keys) is not tuple:
            raise MessageTypeError("keys", "must be a tuple of KeyHandover")
        if len(self.keys) > HANDOVER_ROWS_MAX:
            raise MessageError(
                "keys", f"at most {HANDOVER_ROWS_MAX} per message, got {len(self.keys)}"
            )
        seen: set[RateKey] = set()
        rows = 0
        for i, k in enumerate(self.keys):
            if not isinstance(k, KeyHandover):
                raise MessageTypeError(f"keys[{i}]", "must be a KeyHandover")
            if k.rate_key in seen:
                raise MessageError(f"keys[{i}].rate_key", "repeated in this hand-over")
            seen.add(k.rate_key)
            rows += 1 + len(k.watermarks)
        if rows > HANDOVER_ROWS_MAX:
            raise MessageError(
                "keys", f"at most {HANDOVER_ROWS_MAX} keys and watermarks per message, got {rows}"
            )

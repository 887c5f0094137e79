"""Rate keys on the wire, and the bound on keys per message.

Every message family carries `RateKey`s and every one caps how many a message holds; the
codec reads keys from peers. All three need the same metric names and the same checks,
so they live here, below the families and the codec.
"""

from __future__ import annotations

from typing import Any

from mesh.core._validate import INT_MAX, STR_MAX, check_int, check_str
from mesh.core.policy import RateKey
from mesh.errors import MessageError, MessageTypeError
from ratemesh.policy import METRIC_NAME, check_metric, default_unit
from ratemesh.policy import Unit as _Unit

__all__ = [
    "MAX_ITEMS",
    "REPORT_ROWS_MAX",
    "SNAPSHOT_ROWS_MAX",
    "HANDOVER_ROWS_MAX",
    "is_byte_metric",
    "key_from_wire",
    "key_to_wire",
    "check_keys",
]

MAX_ITEMS = 65_536  # keys any one message may hold; each family caps its own lower (below)
# Reports in one batch. A batch from a peer is decoded and validated on the node's
# loop in one go, so its size is the longest a peer can hold the loop with one message: 256
# rows of keys never seen before decode in about 0.3-0.8 ms (a 65,536-row batch took a
# quarter second). A worker sends more rows as more batches (`report_batch_max`).
REPORT_ROWS_MAX = 256
# Snapshot rows plus rejections in one batch, for the same reason at the worker:
# a batch is decoded and applied whole on its loop. 256 rows decode in 0.22-0.36 ms and the
# reporter takes them in about as long (65,536 rows: beyond 4 MiB, and a quarter second).
# An owner sends more as more batches (`snapshot_batch_max`).
SNAPSHOT_ROWS_MAX = 256
# Keys plus reporters' watermarks in one hand-over: a hand-over is decoded and
# installed whole on the receiver's loop, 4-6 us a key (parked or tightened), 1 us a
# watermark: 64 rows take 0.26-0.44 ms (128 took 0.5-0.87 ms), plus 0.3 ms for the first
# message of a leaver (its rings). A leaving owner sends more as more hand-overs.
HANDOVER_ROWS_MAX = 64

_RATE_KEY_ONLY = frozenset((RateKey,))
# A metric name from a peer is untrusted: it must match the one rule (ratemesh.policy's
# METRIC_NAME: at most 63 characters of [a-z0-9_]) before anything keys a map by it.
_METRIC_OK = METRIC_NAME.fullmatch


def is_byte_metric(metric: str) -> bool:
    """Whether a `UsageReport` for `metric` carries `byte_delta` rather than `iops_delta`.

    The key alone says it, by the name's default unit (`*_bytes`), since a report has no
    policy at hand; the columns a batch carries (`deltas`) are in the policy's unit either
    way, so the split is only `UsageReport`'s seed-004 shape."""
    return default_unit(metric) is _Unit.BYTES


def key_from_wire(field: str, value: Any) -> RateKey:
    if type(value) is list and len(value) == 3:  # the common case, checked in one go
        tenant, metric, gen = value
        if (
            type(metric) is str
            and _METRIC_OK(metric) is not None
            and type(tenant) is str
            and 0 < len(tenant) <= STR_MAX
            and type(gen) is int
            and 1 <= gen <= INT_MAX
        ):
            return RateKey(tenant, metric, gen)
    return _key_checked(field, value)


def _key_checked(field: str, value: Any) -> RateKey:
    """Field by field, so the error names what is wrong."""
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise MessageTypeError(field, "must be [tenant_id, metric, policy_generation]")
    tenant, metric, gen = value
    check_str(f"{field}.tenant_id", tenant, error=MessageError)
    if type(metric) is str and len(metric) > 64:
        metric = metric[:64] + "..."  # the error quotes it: do not echo a megabyte back
    check_metric(metric, field=f"{field}.metric", error=MessageError)
    check_int(f"{field}.policy_generation", gen, minimum=1, error=MessageError)
    return RateKey(tenant, metric, gen)


def key_to_wire(key: RateKey) -> list[Any]:
    return [key.tenant_id, str(key.metric), key.policy_generation]


def check_keys(field: str, keys: Any) -> int:
    if type(keys) is not tuple:
        raise MessageTypeError(field, f"must be a tuple of RateKey, got {type(keys).__name__}")
    if len(keys) > MAX_ITEMS:
        raise MessageError(field, f"at most {MAX_ITEMS} per batch, got {len(keys)}")
    if keys and not set(map(type, keys)) <= _RATE_KEY_ONLY:
        i = next(i for i, k in enumerate(keys) if type(k) is not RateKey)
        raise MessageTypeError(f"{field}[{i}]", "must be a RateKey")
    return len(keys)

"""Integer columns: how batched messages carry their per-key numbers.

A batch of a thousand reports is a thousand rows of the same five integers. Carried as
columns of little-endian int64 (one msgpack `bin` each), they decode in C, can only hold
integers, and are range-checked with C-level `min`/`max`; only a column that fails is
walked in Python, to name the element that is wrong. A batch the cores build from their
own state skips those checks (`unchecked`); one from a peer never does.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any, TypeVar

from mesh.core._validate import INT_MAX, check_int
from mesh.errors import MeshError, MessageError, MessageTypeError

__all__ = ["Int64s", "pack_column", "unpack_column", "check_column", "unchecked"]

_SWAP = sys.byteorder != "little"
_INT_ONLY = frozenset((int,))
_T = TypeVar("_T")


class Int64s(tuple[int, ...]):
    """A column as `unpack_column` decodes it: it can hold only ints, so `check_column`
    checks its range without looking at each element's type again."""

    __slots__ = ()


def pack_column(values: tuple[int, ...] | list[int]) -> bytes:
    col = array("q", values)
    if _SWAP:
        col.byteswap()
    return col.tobytes()


def unpack_column(field: str, data: Any, count: int) -> Int64s:
    """`count` int64s from `data`, or a MessageError naming `field`."""
    if not isinstance(data, bytes):
        raise MessageTypeError(field, f"must be binary (packed int64), got {type(data).__name__}")
    if len(data) != 8 * count:
        raise MessageError(
            field, f"must hold {count} int64 values ({8 * count} bytes), got {len(data)} bytes"
        )
    col = array("q")
    col.frombytes(data)
    if _SWAP:
        col.byteswap()
    return Int64s(col)


def check_column(
    field: str,
    values: Any,
    count: int,
    *,
    minimum: int = 0,
    maximum: int = INT_MAX,
    error: type[MeshError] = MessageError,
) -> None:
    """A tuple of `count` ints in [minimum, maximum]; the error names the first bad one."""
    kind = type(values)
    if kind is not tuple and kind is not Int64s:
        raise MessageTypeError(field, f"must be a tuple of integers, got {type(values).__name__}")
    if len(values) != count:
        raise error(field, f"must have {count} elements (one per key), got {len(values)}")
    if not values:
        return
    if (
        (kind is Int64s or set(map(type, values)) <= _INT_ONLY)
        and min(values) >= minimum
        and max(values) <= maximum
    ):
        return
    for i, v in enumerate(values):  # the slow path: name the first element that is wrong
        check_int(f"{field}[{i}]", v, minimum=minimum, maximum=maximum, error=error)


def unchecked(cls: type[_T], values: tuple[Any, ...]) -> _T:
    """A frozen dataclass instance without __post_init__: what its __init__ does, minus
    the checks (for the cores' own output; never for anything from a peer)."""
    obj = object.__new__(cls)
    for name, value in zip(cls.__slots__, values, strict=True):  # type: ignore[attr-defined]
        object.__setattr__(obj, name, value)
    return obj

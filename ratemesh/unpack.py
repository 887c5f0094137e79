"""msgpack decoding whose cost is bounded by element count, not only by bytes.

Why: every byte of msgpack can be an object. 4 MiB of empty maps (one byte each) decode
into four million dicts: 328 MiB and more than a second of one loop, from one message that
passes every byte limit. Three bounds together cap what a message may build:

* `container_max`: elements in one array or map (msgpack refuses a longer header at once,
  before it allocates anything for it);
* `str_max` / `bin_max`: the length of one string or byte string (the same, at the header);
* `objects_max`: elements in all containers together, counted as each container is
  finished, so decoding stops at the first container past it: at most `objects_max` +
  `container_max` elements are ever built. A message of at most `count_from_bytes` bytes is
  not counted (its bytes bound it already: 64 KiB of empty maps are 4.4 MiB and about 15 ms,
  128 KiB 9 MiB), so a message no larger than the largest legal one pays nothing for this (a
  Python call per container is about a third of a 256-row report batch's decode).

Extension types are refused: nothing here sends them. A message past a bound is a
`ValueError` naming it, which every caller already treats as "not valid msgpack".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = ["COUNT_FROM_BYTES", "UnpackBounds", "unpackb"]

COUNT_FROM_BYTES = 64 * 1024  # by default, messages larger than this have their elements counted


@dataclass(frozen=True, slots=True)
class UnpackBounds:
    """What one message may hold (module docstring); each decoder names its own."""

    objects_max: int
    container_max: int
    str_max: int
    bin_max: int
    count_from_bytes: int = COUNT_FROM_BYTES


class _Count:
    """The elements of the containers finished so far, refused past `limit`."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def take(self, container: Any) -> Any:
        self.left -= len(container) + 1  # an empty container is an object too
        if self.left < 0:
            raise ValueError("too many elements in one message")
        return container


def unpackb(data: bytes, bounds: UnpackBounds, *, use_list: bool = True) -> Any:
    """`msgpack.unpackb(data, raw=False, strict_map_key=True)` within `bounds`."""
    hooks: dict[str, Any] = {}
    if len(data) > bounds.count_from_bytes:
        count = _Count(bounds.objects_max)
        hooks = {"list_hook": count.take, "object_hook": count.take}
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=use_list,
            max_array_len=bounds.container_max,
            max_map_len=bounds.container_max,
            max_str_len=bounds.str_max,
            max_bin_len=bounds.bin_max,
            max_ext_len=0,
            **hooks,
        )
    except ValueError as exc:
        if "too many elements" in str(exc):
            raise ValueError(
                f"more than {bounds.objects_max} elements in one message (of {len(data)} bytes)"
            ) from None
        raise

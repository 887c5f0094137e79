"""governord's address in a node's config: one `host:port`, or several governords that share
one record (a leader and its standbys), as a YAML list or a comma-separated string. The
clients follow the leader among them (`governor.client.Client`, `mesh.peer.CoordinatorClient`).
"""

from __future__ import annotations

from typing import Any

from mesh.errors import ConfigError, ConfigTypeError
from ratemesh.checks import check_address

__all__ = ["GOVERNORD_ADDRS_MAX", "governord_addrs"]

GOVERNORD_ADDRS_MAX = 16  # a leader and its standbys: more is a mistake, not a deployment


def governord_addrs(where: str, value: Any) -> tuple[str, ...]:
    """The addresses `value` names, in order; a ConfigError naming `where` (or `where[i]`
    for a list's entry) for an empty list, a bad or repeated address, or too many."""
    if isinstance(value, str):
        named = [(where, part.strip()) for part in value.split(",")]
    elif isinstance(value, (list, tuple)):
        named = []
        for i, part in enumerate(value):
            if not isinstance(part, str):
                raise ConfigTypeError(f"{where}[{i}]", f"must be host:port, got {part!r}")
            named.append((f"{where}[{i}]", part.strip()))
    else:
        raise ConfigTypeError(
            where, f"must be host:port, several comma-separated, or a list; got {value!r}"
        )
    if not named or named == [(where, "")]:
        raise ConfigError(where, "names no address (want host:port, or a list of them)")
    if len(named) > GOVERNORD_ADDRS_MAX:
        raise ConfigError(where, f"names {len(named)} addresses; at most {GOVERNORD_ADDRS_MAX}")
    out: list[str] = []
    for field, addr in named:
        if not addr:
            raise ConfigError(field, f"{value!r} has an empty address (want host:port,...)")
        check_address(field, addr, error=ConfigError)
        if addr in out:
            raise ConfigError(field, f"names {addr} twice")
        out.append(addr)
    return tuple(out)

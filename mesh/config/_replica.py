"""The rule a replica's name follows: it is the member id the ring, the peer streams and the
spend-quota cells are keyed on, and it travels as a hash field and a table row in the
shared-state tier (docs/redis.md, docs/postgres.md).

A name is a DNS label (`web-0`: lowercase letters, digits and '-', at most 63 characters,
neither end a '-'), a DNS name made of such labels (`web-0.mesh.svc`, at most 253), or an
address (`10.0.0.5`, `10.0.0.5:7001`, `[::1]:7001`), optionally with a port: membership by
DNS A records names members by address and by SRV records by target name.
"""

from __future__ import annotations

import ipaddress
import re

from mesh.errors import ConfigError
from ratemesh.checks import split_address

__all__ = ["NAME_CHARS_MAX", "check_replica_name"]

NAME_CHARS_MAX = 253  # a DNS name's longest text form
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def _is_dns_name(text: str) -> bool:
    return len(text) <= NAME_CHARS_MAX and all(_LABEL.fullmatch(x) for x in text.split("."))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check_replica_name(field: str, value: str) -> str:
    """Return `value` if it is a DNS label, a DNS name or an address with or without a
    port; else a ConfigError naming `field`."""
    host = value
    parts = split_address(value)
    if parts is not None and 0 < parts[1] <= 65535:
        host = parts[0]
    if _is_ip(host) or _is_dns_name(host):
        return value
    raise ConfigError(
        field,
        f"{value!r} is not a replica name: a DNS label (lowercase letters, digits and '-', "
        "at most 63 characters, e.g. web-0), a DNS name of such labels, or an address "
        "(10.0.0.5, 10.0.0.5:7001, [::1]:7001)",
    )

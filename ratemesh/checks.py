"""Field checks shared by the mesh, governord and the simulator.

Each check names the field it guards, so an error says exactly what was wrong, and returns
the value it accepted. `error` picks the family the complaint belongs to (a config mistake by
default; the mesh passes its `MessageError` for a peer's message); a value of the wrong type
raises that family's `type_error`. Nothing here has side effects: a refused value changes
nothing.
"""

from __future__ import annotations

import ipaddress
import math
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from ratemesh.errors import ConfigError, RatemeshError

__all__ = [
    "INT_MAX",
    "STR_MAX",
    "PORT_MAX",
    "check_int",
    "check_str",
    "check_bool",
    "check_choice",
    "check_number",
    "check_float",
    "check_port",
    "check_address",
    "check_addresses",
    "ADDRESSES_MAX",
    "address_parts",
    "with_port",
    "is_wildcard",
    "check_keys",
    "split_address",
    "rename",
    "is_loopback",
    "with_default_family",
]

# 2**63 - 1: larger values cannot cross the wire as msgpack ints and are certainly a mistake.
INT_MAX = (1 << 63) - 1
STR_MAX = 256
PORT_MAX = 65535
# Addresses one list may name: the governords that share one record (a leader and its
# standbys). More is a mistake, not a deployment.
ADDRESSES_MAX = 16

Family = type[RatemeshError]
F = TypeVar("F", bound=Callable[..., Any])


def _kind(value: Any) -> str:
    return type(value).__name__


def check_int(
    field: str,
    value: Any,
    *,
    minimum: int = 0,
    maximum: int = INT_MAX,
    error: Family = ConfigError,
) -> int:
    """Return `value` if it is an int (not a bool) in [minimum, maximum]."""
    if type(value) is not int:
        raise error.type_error(field, f"must be an integer, got {_kind(value)}")
    if value < minimum:
        raise error(field, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise error(field, f"must be <= {maximum}, got {value}")
    return value


def check_str(
    field: str, value: Any, *, max_len: int = STR_MAX, error: Family = ConfigError
) -> str:
    """Return `value` if it is a non-empty str of at most `max_len` characters."""
    if type(value) is not str:
        raise error.type_error(field, f"must be a string, got {_kind(value)}")
    if not value:
        raise error(field, "must not be empty")
    if len(value) > max_len:
        raise error(field, f"must be at most {max_len} characters, got {len(value)}")
    return value


def check_bool(field: str, value: Any, *, error: Family = ConfigError) -> bool:
    if type(value) is not bool:
        raise error.type_error(field, f"must be true or false, got {_kind(value)}")
    return value


def check_choice(
    field: str, value: Any, choices: Mapping[str, Any], *, error: Family = ConfigError
) -> Any:
    """Map a string to one of `choices`, naming the allowed values when it is unknown."""
    if isinstance(value, str) and value in choices:
        return choices[value]
    if not isinstance(value, str):
        raise error.type_error(field, f"must be a string, got {_kind(value)}")
    allowed = ", ".join(sorted(choices))
    raise error(field, f"unknown value {value!r}; expected one of: {allowed}")


def check_number(
    field: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    error: Family = ConfigError,
) -> int | float:
    """Return `value` if it is a finite int or float (not a bool) in [minimum, maximum]."""
    if type(value) not in (int, float):
        raise error.type_error(field, f"must be a number, got {_kind(value)}")
    if not math.isfinite(value):
        raise error(field, f"must be a finite number, got {value}")
    if minimum is not None and value < minimum:
        raise error(field, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise error(field, f"must be <= {maximum}, got {value}")
    return value  # type: ignore[no-any-return]


def check_float(
    field: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    error: Family = ConfigError,
) -> float:
    """`check_number`, returned as a float (an int such as `5` is accepted)."""
    return float(check_number(field, value, minimum=minimum, maximum=maximum, error=error))


def check_port(
    field: str, value: Any, *, allow_zero: bool = False, error: Family = ConfigError
) -> int:
    """A TCP port, 1..65535; `allow_zero` admits 0 ("any free port") where the caller reads
    the bound port back and reports it."""
    return check_int(field, value, minimum=0 if allow_zero else 1, maximum=PORT_MAX, error=error)


def split_address(text: str) -> tuple[str, int] | None:
    """`host:port` or `[v6]:port` -> (host, port) with the brackets removed; None if the text
    has not that shape (the port is not range-checked here)."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            return None
        port = rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if not sep or ":" in host:
            return None
    if not host or not (port.isascii() and port.isdigit()) or len(port) > 5:
        return None
    return host, int(port)


def address_parts(
    field: str, value: Any, *, allow_zero_port: bool = False, error: Family = ConfigError
) -> tuple[str, int]:
    """`value` as (host, port) if it is `host:port` (an IPv6 host in brackets: `[::1]:7001`,
    returned without them) with a port in 1..65535 (0 too where `allow_zero_port`: the
    caller reports the bound port)."""
    text = check_str(field, value, error=error)
    parts = split_address(text)
    if parts is None:
        hint = " (an IPv6 address goes in brackets: [::1]:7001)" if text.count(":") > 1 else ""
        raise error(field, f"{text!r} must be host:port{hint}")
    low = 0 if allow_zero_port else 1
    if not low <= parts[1] <= PORT_MAX:
        raise error(field, f"{text!r}: port {parts[1]} is out of range {low}..{PORT_MAX}")
    return parts


def check_address(
    field: str, value: Any, *, allow_zero_port: bool = False, error: Family = ConfigError
) -> str:
    """Return `value` if it is `host:port` (see `address_parts`)."""
    address_parts(field, value, allow_zero_port=allow_zero_port, error=error)
    return value  # type: ignore[no-any-return]


def with_port(address: str, port: int) -> str:
    """`address` (`host:port`, as `check_address` accepts) with its port replaced: how a
    listener on port 0 reports the port it was given, its host written as configured."""
    host = address_parts("address", address, allow_zero_port=True)[0]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_addresses(field: str, value: Any, *, error: Family = ConfigError) -> tuple[str, ...]:
    """The addresses `value` names, in order: one `host:port`, several comma-separated, or a
    list of them (a leader and its standbys). Refused, naming `field` (or `field[i]` for a
    list's entry): nothing named, an empty entry, an entry that is not host:port, an entry
    named twice, or more than ADDRESSES_MAX."""
    if isinstance(value, str):
        named = [(field, part.strip()) for part in value.split(",")]
    elif isinstance(value, (list, tuple)):
        named = []
        for i, part in enumerate(value):
            if not isinstance(part, str):
                raise error.type_error(f"{field}[{i}]", f"must be host:port, got {part!r}")
            named.append((f"{field}[{i}]", part.strip()))
    else:
        raise error.type_error(
            field, f"must be host:port, several comma-separated, or a list; got {value!r}"
        )
    if not named or named == [(field, "")]:
        raise error(field, "names no address (want host:port, or a list of them)")
    if len(named) > ADDRESSES_MAX:
        raise error(field, f"names {len(named)} addresses; at most {ADDRESSES_MAX}")
    out: list[str] = []
    for where, addr in named:
        if not addr:
            raise error(where, f"{value!r} has an empty address (want host:port,...)")
        check_address(where, addr, error=error)
        if addr in out:
            raise error(where, f"names {addr} twice")
        out.append(addr)
    return tuple(out)


def check_keys(
    where: str, data: Mapping[Any, Any], allowed: Iterable[str], *, error: Family = ConfigError
) -> None:
    """Refuse the first key of `data` (in sorted order) that is not in `allowed`, naming it as
    `where.key` and listing the allowed keys."""
    known = set(allowed)
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        name = f"{where}.{unknown[0]}" if where else unknown[0]
        raise error(name, f"unknown key (a typo?); expected one of: {', '.join(sorted(known))}")


def rename(exc: RatemeshError, prefix: str, error: Family = ConfigError) -> RatemeshError:
    """The same complaint, re-homed under `prefix.` and in `error`'s family."""
    cls = error.type_error if isinstance(exc, TypeError) else error
    new = cls(f"{prefix}.{exc.field}", exc.problem)
    new.__cause__ = exc
    return new


def is_loopback(address: str) -> bool:
    """Whether `host:port` names this machine only (localhost, 127/8, ::1); False for anything
    else, including text that is not an address."""
    parts = split_address(address)
    if parts is None:
        return False
    host = parts[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(address: str) -> bool:
    """Whether `host:port` binds every interface (0.0.0.0, ::, or no host): a listener
    there is reachable by anything that can route to the machine."""
    parts = split_address(address)
    if parts is None:
        return False
    host = parts[0].strip("[]")
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def with_default_family(check: F, error: Family) -> F:
    """A copy of `check` whose `error` defaults to `error`: the same code object, so the
    copy costs no extra call on a hot path (the mesh binds its own `ConfigError` this way)."""
    assert isinstance(check, types.FunctionType)
    copy = types.FunctionType(
        check.__code__, check.__globals__, check.__name__, check.__defaults__, check.__closure__
    )
    copy.__kwdefaults__ = {**(check.__kwdefaults__ or {}), "error": error}
    if "error" in check.__code__.co_varnames[: check.__code__.co_argcount]:
        # `error` is positional-or-keyword (rename): its default sits in __defaults__.
        copy.__defaults__ = (*(check.__defaults__ or ())[:-1], error)
        copy.__kwdefaults__ = check.__kwdefaults__
    copy.__doc__ = check.__doc__
    copy.__qualname__ = check.__qualname__
    copy.__annotations__ = check.__annotations__
    return cast(F, copy)

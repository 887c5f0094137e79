"""Field validation shared by constructors and decoders.

Each check names the field it guards, so an error says exactly what was wrong. `error` picks
the family: `ConfigError` for callers and config files, `MessageError` for peers.
"""

from __future__ import annotations

from typing import Any

from mesh.errors import ConfigError, ConfigTypeError, MeshError, MessageError, MessageTypeError

# 2**63 - 1: larger values cannot cross the wire as msgpack ints and are certainly a mistake.
INT_MAX = (1 << 63) - 1
STR_MAX = 256

_TYPE_ERRORS: dict[type[MeshError], type[MeshError]] = {
    ConfigError: ConfigTypeError,
    MessageError: MessageTypeError,
}


def check_int(
    field: str,
    value: Any,
    *,
    minimum: int = 0,
    maximum: int = INT_MAX,
    error: type[MeshError] = ConfigError,
) -> int:
    """Return `value` if it is an int (not a bool) in [minimum, maximum]."""
    if type(value) is not int:
        raise _TYPE_ERRORS[error](field, f"must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise error(field, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise error(field, f"must be <= {maximum}, got {value}")
    return value


def check_str(
    field: str, value: Any, *, max_len: int = STR_MAX, error: type[MeshError] = ConfigError
) -> str:
    """Return `value` if it is a non-empty str of at most `max_len` characters."""
    if type(value) is not str:
        raise _TYPE_ERRORS[error](field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise error(field, "must not be empty")
    if len(value) > max_len:
        raise error(field, f"must be at most {max_len} characters, got {len(value)}")
    return value


def check_bool(field: str, value: Any, *, error: type[MeshError] = ConfigError) -> bool:
    if type(value) is not bool:
        raise _TYPE_ERRORS[error](field, f"must be true or false, got {type(value).__name__}")
    return value


def check_choice(
    field: str, value: Any, choices: dict[str, Any], *, error: type[MeshError] = ConfigError
) -> Any:
    """Map a string to one of `choices`, naming the allowed values when it is unknown."""
    if isinstance(value, str) and value in choices:
        return choices[value]
    if not isinstance(value, str):
        raise _TYPE_ERRORS[error](field, f"must be a string, got {type(value).__name__}")
    allowed = ", ".join(sorted(choices))
    raise error(field, f"unknown value {value!r}; expected one of: {allowed}")


def rename(exc: MeshError, prefix: str, error: type[MeshError] = ConfigError) -> MeshError:
    """The same complaint, re-homed under `prefix.` and in `error`'s family."""
    cls = _TYPE_ERRORS[error] if isinstance(exc, TypeError) else error
    new = cls(f"{prefix}.{exc.field}", exc.problem)
    new.__cause__ = exc
    return new

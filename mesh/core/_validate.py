"""The shared field checks (`ratemesh.checks`) with the mesh's `ConfigError` family as the
default, so a mesh caller's mistake is a `mesh.errors.ConfigError` (and, through it, a
`ratemesh.errors.ConfigError`). Decoders pass `error=MessageError` for a peer's message.

The checks are bound copies, not wrappers: the decoders call them on the hot path.
"""

from __future__ import annotations

from mesh.errors import ConfigError
from ratemesh import checks as _checks
from ratemesh.checks import INT_MAX, STR_MAX

__all__ = [
    "INT_MAX",
    "STR_MAX",
    "check_int",
    "check_str",
    "check_bool",
    "check_choice",
    "check_number",
    "rename",
]

check_int = _checks.with_default_family(_checks.check_int, ConfigError)
check_str = _checks.with_default_family(_checks.check_str, ConfigError)
check_bool = _checks.with_default_family(_checks.check_bool, ConfigError)
check_choice = _checks.with_default_family(_checks.check_choice, ConfigError)
check_number = _checks.with_default_family(_checks.check_number, ConfigError)
rename = _checks.with_default_family(_checks.rename, ConfigError)

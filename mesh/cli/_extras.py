"""The optional packages some commands need, checked before the work starts: a command
whose extra is not installed says which one in one line (exit 2) rather than ending a long
run in a traceback. The extras are pyproject.toml's; README.md names them."""

from __future__ import annotations

import importlib.util

from ratemesh.errors import ConfigError

__all__ = ["EXTRAS", "require"]

# module -> (extra, what needs it). Every optional import of the CLI's commands is here;
# tests/test_extras.py runs each command with its module hidden.
EXTRAS: dict[str, tuple[str, str]] = {
    "matplotlib": ("sim", "mesh sim run --plot"),
    "limits": ("bench", "mesh bench hotpath and mesh bench suite (the comparison with limits)"),
}


def require(module: str, field: str) -> None:
    """Refuse `field` (the flag, or the package when the command needs it whatever the
    flags) when `module`, an extra's package, is missing."""
    extra, _ = EXTRAS[module]
    try:
        missing = importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # hidden (sys.modules[module] = None) or broken
        missing = True
    if missing:
        raise ConfigError(
            field,
            ("" if field == module else f"needs {module}, which is ")
            + f"not installed; the {extra!r} extra has it: "
            f"pip install -e '.[{extra}]' (or '.[test]', every extra)",
        )

"""A file a node config names: a path relative to the config's own directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mesh.core._validate import check_str
from mesh.errors import ConfigError

__all__ = ["config_file"]


def config_file(where: str, value: Any, base: Path | None) -> str:
    """`value` as a path (relative ones from `base`, the config file's directory) to a file
    that exists, or a ConfigError naming `where`."""
    path = Path(check_str(where, value, max_len=4096))
    if base is not None and not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise ConfigError(where, f"file {path} does not exist")
    return str(path)

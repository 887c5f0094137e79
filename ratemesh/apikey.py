"""Reading an API key (governord's coordinator keys) from a file or an environment variable,
never from a config's text or a command line, where it would be logged or listed by `ps`."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ratemesh.errors import ConfigError

__all__ = ["API_KEY_MAX_BYTES", "read_api_key"]

API_KEY_MAX_BYTES = 4096  # a key is a line, not a document


def read_api_key(
    *,
    file: str | None = None,
    env: str | None = None,
    where: str = "api_key",
    error: type[ConfigError] = ConfigError,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The key in `file` (its first line) or in `$env`; exactly one must be given. Every
    mistake is `error(where_file_or_env, ...)` naming the file or variable."""
    if (file is None) == (env is None):
        raise error(f"{where}_file", f"give one of {where}_file or {where}_env")
    if file is not None:
        field = f"{where}_file"
        try:
            with open(file, "rb") as f:
                raw = f.read(API_KEY_MAX_BYTES + 1)
        except OSError as exc:
            raise error(field, f"cannot read {file}: {exc.strerror or exc}") from exc
        source = file
    else:
        assert env is not None
        field = f"{where}_env"
        value = (os.environ if environ is None else environ).get(env)
        if value is None:
            raise error(field, f"${env} is not set (it should hold the API key)")
        raw, source = value.encode(), f"${env}"
    if len(raw) > API_KEY_MAX_BYTES:
        raise error(field, f"{source} is longer than {API_KEY_MAX_BYTES} bytes")
    try:
        lines = raw.decode().strip().splitlines()
    except UnicodeDecodeError as exc:
        raise error(field, f"{source} is not UTF-8 text") from exc
    key = lines[0].strip() if lines else ""
    if not key:
        raise error(field, f"{source} is empty")
    return key

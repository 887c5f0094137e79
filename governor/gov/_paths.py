"""Where gov keeps its state, and the one rule a slot name follows."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratemesh.errors import ConfigError

__all__ = ["GovDir", "check_name", "gov_dir", "write_atomic", "read_json", "DEFAULT_NAME"]

DEFAULT_NAME = "default"
# A slot or cooldown name is a path component and a label: a DNS-label-like word.
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
# The fail-open log is rotated (one old copy kept) past this size: it is a bounded file.
LOG_BYTES_MAX = 1 << 20


def check_name(value: object, field: str = "name") -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ConfigError(
            field,
            f"{value!r} is not a slot name: lowercase letters, digits, '_', '.', '-', "
            "starting with a letter or digit, at most 63 characters",
        )
    return value


@dataclass(frozen=True)
class GovDir:
    """The state directory: slots/<name>/<i>, waiters/<name>/, cooldown*.json, gov.log."""

    root: Path

    def slots(self, name: str) -> Path:
        return self._dir("slots", name)

    def waiters(self, name: str) -> Path:
        return self._dir("waiters", name)

    def tmp(self) -> Path:
        return self._dir("tmp")

    def cooldown_file(self, name: str | None, *, fleet: bool = False) -> Path:
        """This machine's cooldown (or `name`'s); `fleet`: the copy of the fleet's, as
        governord last said it (replaced at each read, so a fleet-wide clear reaches here)."""
        d = self._dir("fleet") if fleet else self._dir()
        return d / ("cooldown.json" if name is None else f"cooldown-{name}.json")

    @property
    def log_file(self) -> Path:
        return self.root / "gov.log"

    def names(self) -> list[str]:
        """Every slot name that has state here, sorted."""
        found: set[str] = set()
        for kind in ("slots", "waiters"):
            d = self.root / kind
            if d.is_dir():
                found.update(p.name for p in d.iterdir() if NAME.fullmatch(p.name))
        return sorted(found)

    def log(self, event: dict[str, Any]) -> None:
        """Append one JSON line to gov.log (rotated at LOG_BYTES_MAX). Never raises: the
        log must not turn a fail-open into a failure."""
        try:
            self._dir()
            f = self.log_file
            if f.exists() and f.stat().st_size > LOG_BYTES_MAX:
                os.replace(f, f.with_suffix(".log.1"))
            with open(f, "a", encoding="utf-8") as out:
                out.write(json.dumps(event, sort_keys=True) + "\n")
        except OSError:
            pass

    def _dir(self, *parts: str) -> Path:
        d = self.root.joinpath(*parts)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        return d


def gov_dir(environ: dict[str, str] | None = None) -> GovDir:
    """`$GOV_DIR`, else `$XDG_RUNTIME_DIR/ratemesh-gov`, else `/tmp/ratemesh-gov-<uid>`."""
    env = os.environ if environ is None else environ
    if env.get("GOV_DIR"):
        return GovDir(Path(env["GOV_DIR"]))
    if env.get("XDG_RUNTIME_DIR"):
        return GovDir(Path(env["XDG_RUNTIME_DIR"]) / "ratemesh-gov")
    return GovDir(Path(tempfile.gettempdir()) / f"ratemesh-gov-{os.getuid()}")


def write_atomic(path: Path, data: dict[str, Any], tmp_dir: Path) -> None:
    """Write JSON to `path` so a reader sees the old or the new file, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix="w.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object at `path`, or None when it is gone or not (yet) a whole object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

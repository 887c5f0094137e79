"""Where gov keeps its state, and the one rule a slot name follows.

The state directory decides who waits and who runs, and its log holds command lines (which
may carry bearer tokens), so gov uses it only when it is a real directory owned by the user
running gov and closed to everyone else (STATE_DIR_MODE). A directory another user created
first (the default lives in the shared /tmp) is refused, never read: its cooldowns and slots
would be theirs. A directory of ours that others could only read (an older gov made it 0755)
is closed to 0700. Files in it are opened without following symbolic links.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratemesh.errors import ConfigError

__all__ = [
    "DEFAULT_NAME",
    "LOG_FILE_MODE",
    "STATE_DIR_MODE",
    "GovDir",
    "check_name",
    "gov_dir",
    "read_json",
    "write_atomic",
    "write_new",
]

DEFAULT_NAME = "default"
# A slot or cooldown name is a path component and a label: a DNS-label-like word.
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
# The fail-open log is rotated (one old copy kept) past this size: it is a bounded file.
LOG_BYTES_MAX = 1 << 20
# The state directory is the user's alone; the log (command lines, reasons) too.
STATE_DIR_MODE = 0o700
LOG_FILE_MODE = 0o600
# Opening a file in the state directory never follows a link planted in its place.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


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

    def leases(self, name: str) -> Path:
        """This machine's holders of `name`'s governord leases (one file per holder), so
        `gov status` can name who holds what governord only counts."""
        return self._dir("leases", name)

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
        self.check_owned()
        found: set[str] = set()
        for kind in ("slots", "waiters", "leases"):
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
            try:
                if os.lstat(f).st_size > LOG_BYTES_MAX:
                    os.replace(f, f.with_suffix(".log.1"))
            except FileNotFoundError:
                pass
            fd = os.open(f, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, LOG_FILE_MODE)
            with os.fdopen(fd, "a", encoding="utf-8") as out:
                os.fchmod(fd, LOG_FILE_MODE)  # an older gov made it 0644
                out.write(json.dumps(event, sort_keys=True) + "\n")
        except (OSError, ConfigError):
            pass

    def check_owned(self) -> None:
        """Create the state directory (STATE_DIR_MODE) or check the one there: a directory,
        not a link, owned by this user, writable by no one else. Anything else is a
        ConfigError naming GOV_DIR, and nothing in it is read or written."""
        root = self.root
        try:
            root.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
        except FileExistsError:
            pass  # a file or a dangling link where the directory should be: said below
        try:
            st = os.lstat(root)
        except OSError as exc:
            raise ConfigError("GOV_DIR", f"{root}: {exc.strerror or exc}") from exc
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError(
                "GOV_DIR",
                f"{root} is a symbolic link; gov keeps its state only in a real "
                "directory of its own (remove it, or set GOV_DIR)",
            )
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError("GOV_DIR", f"{root} is not a directory (remove it, or set GOV_DIR)")
        uid = os.geteuid()
        if st.st_uid != uid:
            raise ConfigError(
                "GOV_DIR",
                f"{root} belongs to uid {st.st_uid}, not to you (uid {uid}); its slots and "
                "cooldowns could be anyone's: remove it, or set GOV_DIR to a directory of yours",
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            raise ConfigError(
                "GOV_DIR",
                f"{root} is writable by group or others (mode {mode:04o}); another user may "
                f"have planted state in it: remove it, or chmod {STATE_DIR_MODE:o} it",
            )
        if mode & 0o077:
            os.chmod(root, STATE_DIR_MODE)

    def _dir(self, *parts: str) -> Path:
        self.check_owned()
        d = self.root.joinpath(*parts)
        if parts:
            d.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
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


def write_new(path: Path, text: str) -> None:
    """Create `path` (which must not exist yet, not even as a link) holding `text`, 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, LOG_FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object at `path`, or None when it is gone, a link, or not (yet) a whole
    object."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | _NOFOLLOW), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

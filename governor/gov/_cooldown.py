"""The machine-wide cooldown: after a 429 nobody here starts new work until it ends.

One file per scope (`cooldown.json` for the machine, `cooldown-<name>.json` for one name),
holding `until` in epoch seconds, written atomically. A caller waits for the longest of the
machine's and its name's. Tripping only ever extends a cooldown (`trip`); `set` replaces it
(the operator's `gov cooldown SECONDS`, 0 clears it).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ratemesh.checks import check_float

from ._paths import GovDir, check_name, read_json, write_atomic

__all__ = ["COOLDOWN_DEFAULT_S", "COOLDOWN_MAX_S", "Cooldown", "PATTERNS_DEFAULT", "matcher"]

COOLDOWN_DEFAULT_S = 90.0  # seed 003: a 429 backs the whole machine off 90 s
COOLDOWN_MAX_S = 86_400.0
# What counts as "a 429" in a command's output unless GOV_PATTERNS says otherwise: the
# status code as a word, or the phrases providers print with it.
PATTERNS_DEFAULT = (r"\b429\b", r"(?i)too many requests", r"(?i)rate limit exceeded")


def matcher(patterns: tuple[str, ...] | list[str]) -> re.Pattern[bytes]:
    """One compiled alternation over `patterns` (each a Python regex), for output bytes."""
    parts = []
    for p in patterns:
        flags = ""
        if p.startswith("(?i)"):
            flags, p = "(?i:", p[4:]
        parts.append(f"{flags}{p})" if flags else f"(?:{p})")
    return re.compile("|".join(parts).encode())


@dataclass
class Cooldown:
    root: GovDir

    def remaining_s(self, name: str | None = None, now: float | None = None) -> float:
        """Seconds left of the longest cooldown that applies to `name` (0 when none)."""
        t = time.time() if now is None else now
        until = max(self._until(None), self._until(None, fleet=True))
        if name is not None:
            until = max(until, self._until(name), self._until(name, fleet=True))
        return max(0.0, until - t)

    def mirror(self, name: str, all_until: float, name_until: float) -> None:
        """Replace this machine's copy of the fleet's cooldowns (epoch s; 0: none) with
        what governord holds now."""
        tmp = self.root.tmp()
        write_atomic(self.root.cooldown_file(None, fleet=True), {"until": all_until}, tmp)
        write_atomic(self.root.cooldown_file(name, fleet=True), {"until": name_until}, tmp)

    def trip(self, seconds: float, name: str | None = None, reason: str = "") -> float:
        """Extend the cooldown to at least `seconds` from now; returns its `until`."""
        now = time.time()
        until = max(self._until(name), now + _check_seconds(seconds))
        self._write(name, until, reason, now)
        return until

    def set(self, seconds: float, name: str | None = None, reason: str = "manual") -> float:
        """Replace the cooldown with `seconds` from now (0 clears it)."""
        now = time.time()
        until = now + _check_seconds(seconds)
        self._write(name, until, reason, now)
        return until

    def _until(self, name: str | None, *, fleet: bool = False) -> float:
        rec = read_json(self.root.cooldown_file(name, fleet=fleet))
        try:
            return float((rec or {}).get("until", 0.0))
        except (TypeError, ValueError):
            return 0.0

    def _write(self, name: str | None, until: float, reason: str, now: float) -> None:
        if name is not None:
            check_name(name)
        rec = {"until": until, "reason": reason[:200], "set_at": now}
        write_atomic(self.root.cooldown_file(name), rec, self.root.tmp())
        self.root.log({"event": "cooldown", "name": name, **rec, "time": now})


def _check_seconds(seconds: float) -> float:
    return check_float("seconds", seconds, minimum=0.0, maximum=COOLDOWN_MAX_S)

"""Reloading a node's local policy file without a restart: on SIGHUP, on
`Mesh.reload_policies()`, and when the file changes (checked every `policies.watch_ms`).

A reload reads and validates the whole file, then learns its generations all or none
(`PolicyCache.put_all`). A file that cannot be read or parsed (`invalid`), or that gives a
generation the node knows a different meaning (`conflict`: a change needs a new generation,
so a RateKey never changes meaning), is refused with one log line and changes nothing; the
node keeps enforcing what it had. A reload never forgets: a limit taken out of the file stays
enforced until the node restarts (to loosen a limit, publish a new generation of it).

The watch compares the file's stat (mtime, size, inode) each interval and, only when that
moved, its SHA-256 with the last content it tried: an edit is reloaded once, a refused edit
is logged once (not once per interval), and `touch` alone reloads nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mesh.config import load_policy_file
from mesh.core.policy import PolicyCache, TenantRatePolicy
from mesh.errors import ConfigError
from ratemesh.yamlfile import YAML_BYTES_MAX

__all__ = ["PolicyReloader", "ReloadStats", "REFUSED_REASONS"]

log = logging.getLogger("mesh.policy")
REFUSED_REASONS = ("invalid", "conflict")  # the fixed label values of refused reloads
HASH_CHUNK_BYTES = 1 << 16
# A policy file is read whole by the YAML loader, which refuses more than YAML_BYTES_MAX;
# the hash reads no further either (a larger file is refused by the parse that follows).
HASH_BYTES_MAX = YAML_BYTES_MAX + 1

Stat = tuple[int, int, int]  # mtime_ns, size, inode


@dataclass(slots=True)
class ReloadStats:
    """What reloads did, for /health and /metrics."""

    ok: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSED_REASONS, 0))
    learned: int = 0  # reloads that taught the cache at least one new generation
    last_error: str = ""  # the last refusal's one line; cleared by a successful reload
    last_trigger: str = ""  # sighup | watch | api


class PolicyReloader:
    """Reloads `path` into `cache` under `lock` (the node's lock in threaded mode)."""

    def __init__(
        self,
        path: str,
        cache: PolicyCache,
        *,
        watch_ms: int,
        lock: Any = None,
        on_loaded: Callable[[tuple[TenantRatePolicy, ...]], None] | None = None,
    ) -> None:
        self.path = path
        self.cache = cache
        # Told what an accepted reload loaded: the coordinator client declares the node's
        # own generations with each watch (`CoordinatorClient.declared`).
        self.on_loaded = on_loaded
        self.watch_ms = watch_ms
        self.lock = lock or contextlib.nullcontext()
        self.stats = ReloadStats()
        self._stat = _stat(path)  # what the node started from (loaded with its config)
        self._digest = _digest(path)

    def reload(self, trigger: str) -> bool:
        """Read, validate and learn the file now. True if it was accepted (whether or not
        it held anything new); False if refused, with nothing changed."""
        stat, digest = _stat(self.path), _digest(self.path)  # before the read: see watch()
        self._stat, self._digest = stat, digest
        self.stats.last_trigger = trigger
        try:
            policies = load_policy_file(self.path, where="policies.file")
        except ConfigError as exc:
            return self._refuse("invalid", trigger, str(exc))
        try:
            with self.lock:
                changed = self.cache.put_all(policies)
        except ConfigError as exc:
            return self._refuse("conflict", trigger, f"policies.file {self.path}: {exc.problem}")
        self.stats.ok += 1
        self.stats.last_error = ""
        if self.on_loaded is not None:
            self.on_loaded(tuple(policies))
        if changed:
            self.stats.learned += 1  # admission adopts it at its next tick
        log.info(
            "policy reload (%s) of %s: %s; %d limits enforced",
            trigger,
            self.path,
            "new generations learned" if changed else "nothing new",
            len(self.cache),
        )
        return True

    def _refuse(self, reason: str, trigger: str, why: str) -> bool:
        self.stats.refused[reason] += 1
        self.stats.last_error = " ".join(why.split())
        log.warning(
            "policy reload (%s) refused, keeping the %d limits enforced: %s",
            trigger,
            len(self.cache),
            self.stats.last_error,
        )
        return False

    def poll(self) -> bool | None:
        """One check of the watch: reload if the file's content changed since it was last
        read. Returns reload()'s answer, or None when there was nothing to reload."""
        stat = _stat(self.path)
        if stat == self._stat:
            return None
        digest = _digest(self.path)
        if digest == self._digest:
            self._stat = stat  # touched or rewritten with the same bytes
            return None
        return self.reload("watch")

    async def watch(self) -> None:
        """Poll every `watch_ms` until cancelled (the node's task)."""
        while True:
            await asyncio.sleep(self.watch_ms / 1000)
            self.poll()

    def health(self) -> dict[str, Any]:
        s = self.stats
        return {
            "file": self.path,
            "watch_ms": self.watch_ms,
            "ok": s.ok,
            "refused": dict(s.refused),
            "learned": s.learned,
            "last_error": s.last_error or None,
            "last_trigger": s.last_trigger or None,
        }


def _stat(path: str) -> Stat | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _digest(path: str) -> bytes | None:
    """SHA-256 of the file's first HASH_BYTES_MAX bytes; None if it cannot be read."""
    h = hashlib.sha256()
    left = HASH_BYTES_MAX
    try:
        with open(path, "rb") as f:
            while left > 0:
                chunk = f.read(min(HASH_CHUNK_BYTES, left))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
    except OSError:
        return None
    return h.digest()

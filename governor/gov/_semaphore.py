"""A machine-local counting semaphore made of files, with no lock held across the work.

Slot i of a name is the file `slots/<name>/<i>`. A caller claims it by hard-linking a
complete holder record onto that path: `link` is atomic and fails when the path exists, so
two callers can never both hold slot i, and a reader never sees half a record. Giving it
back removes the file. Nothing is locked while the command runs, so a holder that dies
leaves only a file, and the next caller that finds the slot taken reaps it when:

* the holder's heartbeat (the file's mtime, touched every ttl/3) is older than its TTL, or
* neither the holder's process nor the command it started is alive (pids are checked with
  their start time, so a reused pid is not mistaken for the holder).

So a holder killed with SIGKILL frees its slot at once when its command died with it, and
within its TTL when the command outlived it. Callers of one name should agree on `max`: a
caller with a smaller max looks only at the first `max` slots.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._paths import GovDir, check_name, read_json, write_new

__all__ = ["Claim", "Holder", "LocalSemaphore", "SLOTS_MAX", "process_start", "alive"]

# The most slots one name may have: a path per slot, scanned on every claim.
SLOTS_MAX = 1024
# A record that cannot be read (a disk full mid-write elsewhere) is reaped past this age.
UNREADABLE_GRACE_S = 5.0


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux /proc), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def alive(pid: int | None, start: int | None) -> bool:
    """Whether `pid` is the process it was (same start time, where one was recorded)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    if start is not None:
        now = process_start(pid)
        if now is not None and now != start:
            return False  # the pid was reused
    return True


@dataclass(frozen=True)
class Holder:
    """Who holds (or waits for) a slot: written once, at the claim."""

    pid: int
    command: str
    started: float  # epoch seconds
    ttl_s: float
    priority: str = "normal"
    token: str = ""
    pid_start: int | None = None

    @staticmethod
    def here(command: str, ttl_s: float, priority: str = "normal") -> Holder:
        pid = os.getpid()
        return Holder(
            pid, command[:512], time.time(), ttl_s, priority, uuid.uuid4().hex, process_start(pid)
        )

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Holder | None:
        try:
            return Holder(
                int(data["pid"]),
                str(data.get("command", "")),
                float(data["started"]),
                float(data["ttl_s"]),
                str(data.get("priority", "normal")),
                str(data["token"]),
                None if data.get("pid_start") is None else int(data["pid_start"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Claim:
    name: str
    index: int
    path: Path
    holder: Holder


class LocalSemaphore:
    """The slots of one name in one GovDir."""

    def __init__(self, root: GovDir, name: str) -> None:
        self.root = root
        self.name = check_name(name)
        self.dir = root.slots(self.name)

    # -- claiming -------------------------------------------------------------------------

    def try_claim(self, max_slots: int, holder: Holder) -> Claim | None:
        """Claim a free slot among the first `max_slots`, reaping dead holders on the way;
        None when every one is held by a live holder."""
        if not 1 <= max_slots <= SLOTS_MAX:
            raise ValueError(f"max must be 1..{SLOTS_MAX}, got {max_slots}")
        tmp = self._record(holder)
        try:
            for i in range(max_slots):
                path = self.dir / str(i)
                for _ in range(2):  # a reaped slot gets one more try
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        if self._reap_if_dead(path):
                            continue
                        break
                    return Claim(self.name, i, path, holder)
            return None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def release(self, claim: Claim) -> bool:
        """Give the slot back; False if it was no longer ours (reaped past its TTL)."""
        self._forget_child(claim.holder.token)
        return self._take_away(claim.path, claim.holder.token)

    def heartbeat(self, claim: Claim) -> bool:
        """Touch the slot (its mtime is the heartbeat); False if it is no longer ours."""
        rec = read_json(claim.path)
        if rec is None or rec.get("token") != claim.holder.token:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.utime(claim.path)
            return True
        return False

    def note_child(self, claim: Claim, pid: int) -> None:
        """Record the command's pid, so the slot stays held while it runs even if the
        holder itself is killed (until the TTL)."""
        child = {"pid": pid, "pid_start": process_start(pid)}
        path = self.dir / f"child.{claim.holder.token}"
        tmp = self.root.tmp() / f"c.{claim.holder.token}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a leftover of a claim that died here
        write_new(tmp, _dumps(child))
        os.replace(tmp, path)

    # -- reading --------------------------------------------------------------------------

    def holders(self) -> list[tuple[int, Holder, float]]:
        """(slot index, holder, heartbeat age in s) of every live holder, reaping dead ones."""
        out = []
        for path in sorted(self.dir.iterdir(), key=lambda p: p.name):
            if not path.name.isdigit():
                continue
            if self._reap_if_dead(path):
                continue
            rec = read_json(path)
            h = None if rec is None else Holder.from_dict(rec)
            if h is not None:
                out.append((int(path.name), h, _age(path)))
        return out

    # -- healing --------------------------------------------------------------------------

    def _live(self, holder: Holder | None, path: Path) -> bool:
        age = _age(path)
        if holder is None:
            return age < UNREADABLE_GRACE_S
        if age >= holder.ttl_s:
            return False
        if alive(holder.pid, holder.pid_start):
            return True
        child = read_json(self.dir / f"child.{holder.token}")
        return child is not None and alive(child.get("pid"), child.get("pid_start"))

    def _reap_if_dead(self, path: Path) -> bool:
        """Remove the slot at `path` if its holder is dead; True if the slot is free now."""
        rec = read_json(path)
        if rec is None and not path.exists():
            return True
        holder = None if rec is None else Holder.from_dict(rec)
        if self._live(holder, path):
            return False
        token = "" if holder is None else holder.token
        if self._take_away(path, token):
            self._forget_child(token)
            self.root.log(
                {
                    "event": "slot_reaped",
                    "name": self.name,
                    "slot": path.name,
                    "holder": None if holder is None else asdict(holder),
                    "time": time.time(),
                }
            )
        return True

    def _take_away(self, path: Path, token: str) -> bool:
        """Remove `path` if it still holds `token`'s record. Renamed aside first, then
        checked: a record claimed in between by someone else is linked back."""
        grave = self.root.tmp() / f"r.{uuid.uuid4().hex}"
        try:
            os.rename(path, grave)
        except FileNotFoundError:
            return False
        try:
            rec = read_json(grave)
            if (rec or {}).get("token", "") == token:
                return True
            with contextlib.suppress(FileExistsError):
                os.link(grave, path)  # not the record we meant: put it back
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(grave)

    def _forget_child(self, token: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.dir / f"child.{token}")

    def _record(self, holder: Holder) -> Path:
        tmp = self.root.tmp() / f"h.{holder.token}.{uuid.uuid4().hex[:8]}"
        write_new(tmp, _dumps(asdict(holder)))
        return tmp


def _age(path: Path) -> float:
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except FileNotFoundError:
        return 0.0


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True)

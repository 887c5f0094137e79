"""`gov run`: take a slot, run the command as if gov were not there, give the slot back.

The command's stdout and stderr are copied through unchanged (byte for byte, as they come)
and scanned for the 429 patterns on the way; its exit status is gov's, and a signal that
ends it ends gov the same way once the slot is back. SIGINT, SIGTERM, SIGHUP and SIGQUIT
sent to gov are passed to the command. The slot is held while the command runs (heartbeat
every ttl/3) and given back however it ends.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

from ._cooldown import COOLDOWN_DEFAULT_S, Cooldown
from ._paths import GovDir
from ._semaphore import LocalSemaphore
from ._slots import Acquired, release_slot

__all__ = ["run_command", "FORWARDED", "CHUNK_BYTES", "PATTERN_CARRY_BYTES"]

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
CHUNK_BYTES = 64 * 1024
# Bytes of the previous chunk kept for the scan, so a match across two reads is seen.
PATTERN_CARRY_BYTES = 256
EXIT_NOT_FOUND = 127  # the shell's status for a command that could not be run


class Scan:
    """Watches output for the 429 patterns; the first hit trips the cooldown once."""

    def __init__(self, pattern: re.Pattern[bytes], on_hit: Callable[[bytes], None]) -> None:
        self.pattern = pattern
        self.on_hit = on_hit
        self.hit = False
        self._lock = threading.Lock()

    def feed(self, carry: bytes, chunk: bytes) -> bytes:
        if not self.hit:
            m = self.pattern.search(carry + chunk)
            if m is not None:
                with self._lock:
                    if not self.hit:
                        self.hit = True
                        self.on_hit(m.group(0))
        return (carry + chunk)[-PATTERN_CARRY_BYTES:]


def _pump(src: IO[bytes], dst: IO[bytes], scan: Scan) -> None:
    carry = b""
    fd = src.fileno()
    while True:
        try:
            chunk = os.read(fd, CHUNK_BYTES)
        except OSError:
            break
        if not chunk:
            break
        try:
            dst.write(chunk)
            dst.flush()
        except (BrokenPipeError, ValueError):
            pass  # nobody reads gov's output any more; keep draining the command's
        carry = scan.feed(carry, chunk)
    src.close()


def run_command(
    argv: list[str],
    got: Acquired,
    root: GovDir,
    *,
    pattern: re.Pattern[bytes],
    cooldown_s: float = COOLDOWN_DEFAULT_S,
    cooldown_name: str | None = None,
    on_trip: Callable[[float], None] | None = None,
) -> int:
    """Run `argv` under `got` and return the exit status gov should end with (a negative
    number -N: the command was ended by signal N, which the caller re-raises)."""
    sem = LocalSemaphore(root, got.name)
    cooldown = Cooldown(root)

    def tripped(what: bytes) -> None:
        text = what.decode("utf-8", "replace")
        cooldown.trip(cooldown_s, cooldown_name, f"{text!r} in the output of {shlex.join(argv)}")
        print(
            f"gov: {text!r} seen: cooldown of {cooldown_s:g}s for "
            f"{'this machine' if cooldown_name is None else repr(cooldown_name)}",
            file=sys.stderr,
            flush=True,
        )
        if on_trip is not None:
            on_trip(cooldown_s)

    scan = Scan(pattern, tripped)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        release_slot(root, got)
        print(f"gov: cannot run {argv[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    if got.claim is not None:
        sem.note_child(got.claim, proc.pid)
    previous = {s: signal.signal(s, lambda n, _f: _forward(proc, n)) for s in FORWARDED}
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, scan), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, scan), daemon=True),
    ]
    for t in pumps:
        t.start()
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(sem, got, stop), daemon=True)
    beat.start()
    try:
        while True:
            try:
                status = proc.wait()
                break
            except KeyboardInterrupt:  # SIGINT arrived before our handler: keep waiting
                continue
        for t in pumps:
            t.join()
    finally:
        stop.set()
        for s, h in previous.items():
            signal.signal(s, h)
        release_slot(root, got)
    return status


def _forward(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        proc.send_signal(signum)
    except ProcessLookupError:
        pass


def _heartbeat(sem: LocalSemaphore, got: Acquired, stop: threading.Event) -> None:
    if got.claim is None:
        return
    period = max(0.5, got.claim.holder.ttl_s / 3)
    while not stop.wait(period):
        if not sem.heartbeat(got.claim):
            return


def exit_like(status: int) -> int:
    """End this process as the command ended: its exit code, or re-raise its signal."""
    if status >= 0:
        return status
    signum = -status
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(1)  # the signal is delivered before this ends
    return 128 + signum

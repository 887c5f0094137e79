"""`slot()` in Python: the same slots as `gov run`, sync and async."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from governor.client import Slot, slot
from governor.gov import Cooldown, GovDir


def test_threads_never_exceed_max(tmp_path: Path) -> None:
    root = GovDir(tmp_path / "gov")
    lock = threading.Lock()
    now = peak = 0

    def work() -> None:
        nonlocal now, peak
        with Slot("model", max=2, root=root) as s:
            assert s.held
            with lock:
                now += 1
                peak = max(peak, now)
            time.sleep(0.05)
            with lock:
                now -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 2


def test_async_with_and_release_on_error(tmp_path: Path) -> None:
    root = GovDir(tmp_path / "gov")

    async def main() -> int:
        peak = now = 0

        async def one() -> None:
            nonlocal now, peak
            async with Slot("model", max=3, root=root):
                now += 1
                peak = max(peak, now)
                await asyncio.sleep(0.02)
                now -= 1

        await asyncio.gather(*(one() for _ in range(9)))
        return peak

    assert asyncio.run(main()) == 3
    with pytest.raises(RuntimeError):
        with Slot("model", max=1, root=root):
            raise RuntimeError("boom")
    with Slot("model", max=1, root=root, wait_s=0.1) as s:
        assert s.held  # the failed block gave its slot back


def test_saw_429_cools_the_machine_and_fails_open(tmp_path: Path) -> None:
    root = GovDir(tmp_path / "gov")
    with Slot("api", max=1, root=root) as s:
        s.saw_429(30)
    assert Cooldown(root).remaining_s("other") > 25
    with Slot("api", max=1, root=root, priority="high", wait_s=0.1) as late:
        assert not late.held and late.got is not None and "cooldown" in (late.got.fail_open or "")


def test_slot_uses_gov_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOV_DIR", str(tmp_path / "envdir"))
    with slot("x", max=1) as s:
        assert s.held and (tmp_path / "envdir" / "slots" / "x" / "0").exists()

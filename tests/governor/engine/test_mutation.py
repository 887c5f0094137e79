"""Mutation check: deliberate bugs in the engine must make the randomized invariant test fail.

Each mutant is a copy of ``governor/`` with one text replacement; the replacement must match
exactly once, so a refactor that moves the code makes this test fail loudly rather than pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# (name, file under governor/engine (or a path from the repository root), original, buggy)
MUTANTS = [
    (
        "scope check on edits dropped",
        "_core.py",
        "if edit and node.id == scope:",
        "if False and edit and node.id == scope:",
    ),
    (
        "'no cap' ignored",
        "_state.py",
        "if e.limit is None:\n            quotas.pop(e.resource, None)",
        "if e.limit is None:\n            pass",
    ),
    (
        "defaults change not restored",
        "_snapshot.py",
        '"defaults": encode_value(Defaults | None, n.defaults),',
        '"defaults": None,',
    ),
    (
        "tombstone forgotten",
        "_state.py",
        "self.tombstones[e.lease_id] = Tombstone(lease, e.end, e.at_ms)",
        "pass",
    ),
    (
        "grant past a lowered limit",
        "_leasebook.py",
        "if limit is not None and a.held.get(cls, 0) >= limit:",
        "if limit is not None and a.held.get(cls, 0) == limit:",
    ),
    (
        "head-of-line blocking in the fair queue",
        "_fairq.py",
        "waiter = next((w for w in self.queues[tenant_id] if fits(w)), None)",
        "waiter = next((w for w in self.queues[tenant_id][:1] if fits(w)), None)",
    ),
    (
        "charge applied to the node only",
        "_state.py",
        "for node in self.chain(e.node_id):\n            node.used",
        "for node in self.chain(e.node_id)[:1]:\n            node.used",
    ),
    # credit blocks (docs/strict.md): C1-C4 of governor.testing.credit must catch each
    (
        "credit return applied twice",
        "_creditbook.py",
        "block.returned = True\n",
        "pass\n",
    ),
    (
        "credit grant not charged to an ancestor's bucket",
        "_creditbook.py",
        "if bucket is not None:\n                level = _advance(bucket, e.at_ms)\n",
        "if bucket is not None and node.id == e.node_id:\n"
        "                level = _advance(bucket, e.at_ms)\n",
    ),
    (
        "worker times a block from the reply instead of the send",
        "ratemesh/credit.py",
        "local_expiry_ms(request.sent_at_ms, ttl_ms,",
        "local_expiry_ms(now, ttl_ms,",
    ),
    (
        "bucket refills past outstanding credit",
        "_bucket.py",
        "cap = (rate.burst - outstanding) * MILLI",
        "cap = rate.burst * MILLI",
    ),
    (
        "governord forgets a block before the worker's ttl",
        "_credit.py",
        "grant, now + ttl, tag",
        "grant, now + ttl // 2, tag",
    ),
]


def _mutant_tree(tmp: Path, file: str, old: str, new: str) -> Path:
    dst = tmp / "src"
    for package in ("governor", "ratemesh"):  # the fuzzer's credit workers use ratemesh
        shutil.copytree(
            ROOT / package,
            dst / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    target = dst / file if "/" in file else dst / "governor" / "engine" / file
    text = target.read_text()
    assert text.count(old) == 1, f"mutation site not found exactly once in {file}: {old!r}"
    target.write_text(text.replace(old, new))
    return dst


@pytest.mark.slow
@pytest.mark.parametrize("name,file,old,new", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_randomized_test_catches_mutant(
    tmp_path: Path, name: str, file: str, old: str, new: str
) -> None:
    proc = _fuzz(tmp_path, _mutant_tree(tmp_path, file, old, new), "0:40", 1500, 600)
    assert proc.returncode == 1, f"mutant {name!r} survived:\n{proc.stdout}\n{proc.stderr}"
    assert "FAIL seed" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
def test_unmutated_copy_passes_a_few_seeds(tmp_path: Path) -> None:
    """The harness itself is sound: the real engine, copied the same way, passes."""
    src = _mutant_tree(tmp_path, "_core.py", "if edit and", "if edit and")
    proc = _fuzz(tmp_path, src, "0:3", 600, 300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _fuzz(
    cwd: Path, src: Path, seeds: str, ops: int, timeout_s: int
) -> subprocess.CompletedProcess[str]:
    """The invariant fuzzer over the engine copy at `src`, in its own process: `src` comes
    first on the path, so ``governor.testing.fuzz`` and the engine it drives are the copy's."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "governor.testing.fuzz", "--seeds", seeds, "--ops", str(ops)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )

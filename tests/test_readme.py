"""The README's embedding example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_node_example_runs(tmp_path: Path) -> None:
    section = README.read_text().split("## Running a mesh node", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    assert len(code.group(1).strip().splitlines()) <= 30
    script = tmp_path / "example.py"
    script.write_text(code.group(1))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    admitted = int(out.stdout.split()[1])
    assert 0 < admitted <= 100 + 1000 * 2 + 2 * 20, out.stdout

"""`mesh sim` and `mesh bench` run the simulator (`sim/`) and the benchmarks (`bench/`) from a
checkout of the repository.

They are not installed with the distribution: top-level packages with names as generic as
`sim` and `bench` would collide with other projects' in site-packages. In a checkout (an
editable install, or `python -m mesh.cli` from the source tree) they sit beside the `mesh`
package this command runs from, so that directory is put on the import path, for the
benchmarks' worker processes too. From an installed wheel there is nothing beside it, and
the command says so in one line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ratemesh.errors import ConfigError

__all__ = ["TOOLS", "require"]

# Folder beside the packages -> what it holds, for the message.
TOOLS = {"sim": "the simulator", "bench": "the benchmarks"}


def require(name: str) -> None:
    """Make the checkout's `sim` or `bench` importable, or raise a one-line ConfigError."""
    root = Path(__file__).resolve().parents[2]
    if not (root / name / "__init__.py").is_file():
        raise ConfigError(
            name,
            f"{TOOLS[name]} ({name}/) run from a checkout of ratemesh and are not installed "
            f"with the package: clone the repository, `pip install -e .` there, then run "
            f"`mesh {name}` again",
        )
    where = str(root)
    if where not in sys.path:
        sys.path.insert(0, where)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if where not in paths:  # the benchmarks' workers are `python -m bench.<name>` processes
        os.environ["PYTHONPATH"] = os.pathsep.join([where, *filter(None, paths)])

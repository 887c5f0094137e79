"""Planted bugs: switches that break failover on purpose, so tests can show the linearizability
checker catches each (docs/linearizability.md, "planted bugs"). Nothing sets one but a test.

``GOVERNOR_PLANT_BUG`` names at most one, and governord logs a warning at start when it does:

* ``skip_epoch_check`` - commits renew the leader row without checking that the epoch is still
  this process's, a takeover does not end the old holder's backend, and reads are answered
  without a commit round to confirm the epoch: a deposed leader keeps answering;
* ``serve_before_replay`` - a standby stops tailing the record after its first look and, when
  it takes over, serves from that stale copy instead of reading the rest first.
"""

from __future__ import annotations

import os

from governor.config import ConfigError

__all__ = ["PLANTS", "planted"]

PLANTS = ("skip_epoch_check", "serve_before_replay")
ENV = "GOVERNOR_PLANT_BUG"


def planted() -> str | None:
    """The planted bug this process runs with, or None; an unknown name is refused."""
    name = os.environ.get(ENV, "")
    if not name:
        return None
    if name not in PLANTS:
        raise ConfigError(ENV, f"must be one of {', '.join(PLANTS)}, got {name!r}")
    return name

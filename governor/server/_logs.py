"""governord's log: the daemons' one formatter (``ratemesh.logs``) under the ``governord``
logger, JSON (the default) or ``--log-format text``.

The operator's start-up mistakes are not log events: ``governord`` prints them as one line and
exits 2 before the log is set up (``governor.cli``).
"""

from __future__ import annotations

from typing import TextIO

from ratemesh import logs
from ratemesh.logs import FIELDS, LOG_FORMATS, JsonLines, TextLines, event

__all__ = ["LOG_FORMATS", "FIELDS", "JsonLines", "TextLines", "configure", "event"]

_ROOT = "governord"


def configure(fmt: str = "json", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send governord's loggers to ``stream`` (stderr) in ``fmt``; replaces an earlier call's
    handler, so a test or an embedding process can call it again."""
    logs.configure((_ROOT,), fmt, level, stream)

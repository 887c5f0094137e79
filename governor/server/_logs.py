"""governord's log: one event per line on stderr, as JSON (the default) or as text.

A JSON line carries ``ts`` (UTC, milliseconds), ``level``, ``logger``, ``msg`` and the event's
own fields (``request_id``, ``method``, ``code``, ``tenant``, ``took_ms`` for a call), so a log
pipeline indexes them without parsing the message; a traceback is the ``exc`` field, still one
line. ``--log-format text`` prints ``governord: msg key=value ...`` for a terminal.

The operator's start-up mistakes are not log events: ``governord`` prints them as one line and
exits 2 before the log is set up (``governor.cli``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = ["LOG_FORMATS", "FIELDS", "JsonLines", "TextLines", "configure", "event"]

LOG_FORMATS = ("json", "text")
FIELDS = "fields"  # the LogRecord attribute that holds an event's own fields
_ROOT = "governord"


def _fields(record: logging.LogRecord) -> Mapping[str, Any]:
    found = getattr(record, FIELDS, None)
    return found if isinstance(found, Mapping) else {}


class JsonLines(logging.Formatter):
    """A record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _fields(record).items():
            out.setdefault(key, value)  # an event's field never overwrites the envelope
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class TextLines(logging.Formatter):
    """``governord: msg key=value ...``: the lines governord printed before the JSON log."""

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{_ROOT}: {record.getMessage()}" + (f" ({extra})" if extra else "")
        if record.exc_info:
            line += " " + " | ".join(self.formatException(record.exc_info).splitlines())
        return line


def configure(fmt: str = "json", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send governord's loggers to ``stream`` (stderr) in ``fmt``; replaces an earlier call's
    handler, so a test or an embedding process can call it again."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    root = logging.getLogger(_ROOT)
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonLines() if fmt == "json" else TextLines())
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False


def event(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    """Log ``msg`` with its fields (None values left out), if ``level`` is on."""
    if logger.isEnabledFor(level):
        kept = {k: v for k, v in fields.items() if v is not None}
        logger.log(level, msg, extra={FIELDS: kept})

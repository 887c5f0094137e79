"""The daemons' log: one event per line on stderr, as JSON (the default) or as text.

One formatter for `mesh node` and `governord`, so one log pipeline reads both. A JSON line
carries ``ts`` (UTC, milliseconds), ``level``, ``logger``, ``event`` (a stable name for what
happened, such as ``coordinator_unreachable``; a line logged without one carries its message
template, which is as stable), ``msg`` (the sentence a person reads) and the event's own
fields (``dependency``, ``reason``, ``tenant``, ``took_ms`` ...), so a pipeline indexes them
without parsing the message; a traceback is the ``exc`` field, still one line.
``--log-format text`` prints ``<daemon>: msg (key=value ...)`` for a terminal.

The operator's start-up mistakes are not log events: each daemon prints them as one line and
exits 2 before the log is set up.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

__all__ = [
    "EVENT",
    "FIELDS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "JsonLines",
    "TextLines",
    "configure",
    "event",
]

LOG_FORMATS = ("json", "text")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FIELDS = "fields"  # the LogRecord attribute that holds an event's own fields
EVENT = "event_name"  # the LogRecord attribute that holds an event's stable name


def _fields(record: logging.LogRecord) -> Mapping[str, Any]:
    found = getattr(record, FIELDS, None)
    return found if isinstance(found, Mapping) else {}


def _event_name(record: logging.LogRecord) -> str:
    found = getattr(record, EVENT, None)
    return found if isinstance(found, str) else str(record.msg)


class JsonLines(logging.Formatter):
    """A record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": _event_name(record),
            "msg": record.getMessage(),
        }
        for key, value in _fields(record).items():
            out.setdefault(key, value)  # an event's field never overwrites the envelope
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class TextLines(logging.Formatter):
    """``<prefix>: msg (key=value ...)``: a line for a person at a terminal; with `levels`,
    a level other than INFO is said first (``<prefix>: warning: msg``)."""

    def __init__(self, prefix: str, *, levels: bool = False) -> None:
        super().__init__()
        self.prefix = prefix
        self.levels = levels

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        plain = not self.levels or record.levelno == logging.INFO
        level = "" if plain else f"{record.levelname.lower()}: "
        line = f"{self.prefix}: {level}{record.getMessage()}" + (f" ({extra})" if extra else "")
        if record.exc_info:
            line += " " + " | ".join(self.formatException(record.exc_info).splitlines())
        return line


def configure(
    roots: Sequence[str],
    fmt: str = "json",
    level: str = "INFO",
    stream: TextIO | None = None,
    *,
    prefix: str | None = None,
    levels: bool = False,
) -> None:
    """Send the loggers under each of ``roots`` to ``stream`` (stderr) in ``fmt``; replaces an
    earlier call's handler, so a test or an embedding process can call it again. ``prefix``
    starts a text line (the first root by default); ``levels``: a text line names its level
    (but INFO)."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    text = TextLines(prefix or roots[0], levels=levels)
    handler.setFormatter(JsonLines() if fmt == "json" else text)
    for name in roots:
        root = logging.getLogger(name)
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(level.upper())
        root.propagate = False


def event(
    logger: logging.Logger, level: int, msg: str, *, name: str | None = None, **fields: Any
) -> None:
    """Log ``msg`` as event ``name`` with its fields (None values left out), if ``level``
    is on."""
    if logger.isEnabledFor(level):
        kept = {k: v for k, v in fields.items() if v is not None}
        extra: dict[str, Any] = {FIELDS: kept}
        if name is not None:
            extra[EVENT] = name
        logger.log(level, msg, extra=extra)

"""The daemons' one log formatter: a JSON object a line with the envelope first and an
event's fields after (never over it), a stable `event`, a traceback kept on one line; and
the text form for a terminal."""

from __future__ import annotations

import io
import json
import logging

import pytest

from ratemesh import logs


def _logged(fmt: str, **kw: object) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    logs.configure(("t.logs",), fmt, "DEBUG", out, **kw)  # type: ignore[arg-type]
    return logging.getLogger("t.logs.part"), out


def test_a_json_line_carries_the_envelope_and_the_fields() -> None:
    log, out = _logged("json")
    logs.event(log, logging.WARNING, "coordinator failing", name="dependency_down", ts="x")
    log.info("ring epoch %d", 3)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("crashed")
    first, second, third = (json.loads(line) for line in out.getvalue().splitlines())
    assert list(first)[:5] == ["ts", "level", "logger", "event", "msg"]
    assert first["level"] == "warning" and first["event"] == "dependency_down"
    assert first["logger"] == "t.logs.part" and first["ts"].endswith("Z")
    assert second["event"] == "ring epoch %d" and second["msg"] == "ring epoch 3"
    assert "ValueError: boom" in third["exc"] and len(out.getvalue().splitlines()) == 3


def test_the_text_form_and_its_levels() -> None:
    log, out = _logged("text", prefix="mesh node", levels=True)
    logs.event(log, logging.WARNING, "down", name="dependency_down", dependency="coordinator")
    log.info("up")
    assert out.getvalue().splitlines() == [
        "mesh node: warning: down (dependency=coordinator)",
        "mesh node: up",
    ]


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="json, text"):
        logs.configure(("t.logs",), "xml")

"""JSON log lines: one schema, only known fields, the current span's ids."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from capgate.cli.logs import FIELDS, JsonLines, configure_logging, log_decision
from capgate.gateway.enforce.dispatcher import DecisionEvent


def record(message: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("capgate.test", logging.INFO, __file__, 1, message, args, None)
    for name, value in extra.items():
        setattr(made, name, value)
    return made


def test_a_line_has_the_fixed_keys_and_only_known_fields():
    line = json.loads(
        JsonLines().format(
            record("hello %s", "world", decision_id="d-1", tool="t.x", password="hunter2")
        )
    )
    assert line["message"] == "hello world"
    assert line["level"] == "info"
    assert line["logger"] == "capgate.test"
    assert line["event"] == "log"
    assert line["time"].endswith("Z")
    assert line["decision_id"] == "d-1"
    assert line["tool"] == "t.x"
    assert "password" not in line  # not a field of the schema: never taken
    assert "hunter2" not in json.dumps(line)
    assert "trace_id" not in line  # no span


def test_the_current_span_s_ids_are_on_the_line():
    context = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(1),
    )
    with trace.use_span(NonRecordingSpan(context)):
        line = json.loads(JsonLines().format(record()))
    assert line["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert line["span_id"] == "00f067aa0ba902b7"


def test_an_exception_is_kept_as_text():
    try:
        raise ValueError("broken")
    except ValueError:
        made = record()
        made.exc_info = sys.exc_info()
    line = json.loads(JsonLines().format(made))
    assert "ValueError: broken" in line["error"]


@pytest.fixture
def captured(capsys) -> Iterator[Callable[[], str]]:
    """What the configured handler writes to stderr; the root's handlers restored."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield lambda: capsys.readouterr().err
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_decision_is_one_line_with_its_facts_and_no_parameters(captured):
    configure_logging("info", "json")
    log_decision(
        DecisionEvent(
            kind="execute",
            agent="sales-bot",
            allow=False,
            tool="quote.propose",
            reason_codes=("budget_exhausted",),
            decision_id="dec-7",
            stage="call",
            revision="capgate=r1",
        )
    )
    logging.getLogger("other.library").info("not shown below WARNING")
    [text] = captured().splitlines()
    line = json.loads(text)
    assert line["event"] == "decision"
    assert (line["question"], line["allow"], line["tool"]) == ("execute", False, "quote.propose")
    assert line["reason_codes"] == ["budget_exhausted"]
    assert line["decision_id"] == "dec-7"
    assert line["revision"] == "capgate=r1"
    assert "dec-7" in line["message"]
    assert set(line) <= {"time", "level", "logger", "message", "trace_id", "span_id", *FIELDS}


def test_text_lines_stay_as_they_were(captured):
    configure_logging("info", "text")
    log_decision(DecisionEvent(kind="compose", agent="a", allow=True, visible=("x", "y")))
    [text] = captured().splitlines()
    assert text.endswith("capgate.decisions: compose allow 2 tool(s) visible, decision none")

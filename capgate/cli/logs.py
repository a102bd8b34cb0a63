"""The log lines of ``capgate serve`` and ``capgate worker``: text for people, or JSON
lines of one schema for the log pipelines that already read OPA's JSON beside them.

Every line goes to stderr (stdout is the MCP channel over stdio). capgate's own
loggers (``capgate.*``) log at the chosen level, every other library's at WARNING.
A JSON line is one object::

    {"time": "2026-12-02T10:00:00.123Z", "level": "info", "logger": "capgate.decisions",
     "event": "decision", "message": "execute allow quote.propose",
     "decision_id": "...", "trace_id": "...", "span_id": "...", "tool": "quote.propose",
     "reason_codes": [], ...}

``time``, ``level``, ``logger``, ``event`` and ``message`` are always there (``event``
is ``log`` for a line that names none); the others when the line has them. Only the
fields of :data:`FIELDS` are taken from a record, so nothing a caller attaches by
accident reaches the line. ``trace_id`` and ``span_id`` are the current OpenTelemetry
span's, when ``opentelemetry-api`` is installed and a span is recording. A line's
message is what the text format prints: the masking rules are the messages' own
(tokens and credentials never reach a message; values go through ``quote``), and no
format adds anything else.

Each decision the gateway makes is a line of its own (:func:`log_decision`,
``capgate.decisions`` at INFO): which question, allow or deny, the tool, the reason
codes, the decision id, the stage, the outcome status and the policy's revision;
never parameters, content or the tool's output.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final, Literal

from capgate.gateway.enforce.dispatcher import DecisionEvent

__all__ = ["FIELDS", "JsonLines", "LogFormat", "configure_logging", "log_decision"]

LogFormat = Literal["text", "json"]

#: The fields a record may carry into a JSON line (``extra={...}`` of a log call).
FIELDS: Final = (
    "event",
    "decision_id",
    "tool",
    "reason_codes",
    "allow",
    "question",
    "stage",
    "status",
    "revision",
    "agent",
    "proposal_id",
    "operation_id",
)

decisions = logging.getLogger("capgate.decisions")


class JsonLines(logging.Formatter):
    """One JSON object per record, in the schema of the module's docstring."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", None) or "log",
            "message": record.getMessage(),
        }
        for name in FIELDS[1:]:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = list(value) if isinstance(value, tuple) else value
        line.update(_trace_ids())
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _trace_ids() -> dict[str, str]:
    """The current span's trace and span ids (hex), when there is one."""
    try:
        from opentelemetry import trace
    except ImportError:  # the API is optional; without it there are no spans
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


class _OwnLevel(logging.Filter):
    """capgate's records at the chosen level, everyone else's at WARNING."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name.startswith("capgate.")
        return record.levelno >= (self.level if ours else logging.WARNING)


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """Log lines on stderr in ``log_format``: capgate's at ``level``, the rest at
    WARNING only."""
    number = logging.getLevelNamesMapping()[level.upper()]
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_OwnLevel(number))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(number, logging.WARNING))


def log_decision(event: DecisionEvent) -> None:
    """The gateway's observer: one line per decision (see the module's docstring)."""
    if not decisions.isEnabledFor(logging.INFO):
        return
    verdict = "allow" if event.allow else "deny"
    subject = event.tool or f"{len(event.visible)} tool(s) visible"
    codes = f" ({', '.join(event.reason_codes)})" if event.reason_codes else ""
    decisions.info(
        "%s %s %s%s, decision %s",
        event.kind,
        verdict,
        subject,
        codes,
        event.decision_id or "none",
        extra={
            "event": "decision",
            "question": event.kind,
            "allow": event.allow,
            "tool": event.tool,
            "reason_codes": list(event.reason_codes),
            "decision_id": event.decision_id,
            "stage": event.stage,
            "status": event.status,
            "revision": event.revision,
            "agent": event.agent,
        },
    )

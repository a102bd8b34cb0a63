"""OpenTelemetry spans of the gateway, through ``opentelemetry-api`` alone.

capgate never configures OpenTelemetry: it asks the API for a tracer, and whatever
the application set up (an SDK with an exporter, or nothing) gets the spans. Without
an SDK every span is a no-op that still carries the caller's trace context, so log
lines name the MCP client's trace (:mod:`capgate.cli.logs`). Without the API
installed at all, :func:`span` does nothing.

The spans, each a child of whatever is current (over MCP, the SDK's ``tools/call``
span):

=============================  ====================================================
span                           around
=============================  ====================================================
``capgate.compose``            :meth:`Gateway.compose` (which tools an agent sees)
``capgate.execute``            :meth:`Gateway.call` (decide, then run or propose)
``capgate.review``             :meth:`Gateway.review` (the review policy's verdict)
``capgate.dispatch``           :meth:`Gateway.dispatch` (an approved proposal runs)
``capgate.tool``               the tool's own run, inside execute or dispatch
``capgate.store.transaction``  each store transaction
=============================  ====================================================

**Attributes are an allow-list** (:data:`ATTRIBUTES`): the decision id, allow, the
reason codes, the tool and its version, the operation id, the stage, the outcome
status, the policy bundle's revision, whether a transaction only read. Anything else
given to :func:`annotate` is dropped, so no parameter, content, credential or tool
output can reach an exporter by accident.

**The trace goes on** (:func:`trace_context`): every request to OPA carries the
current span's W3C ``traceparent`` (and ``tracestate``, if any) as HTTP headers, and
every ``tools/call`` to an upstream MCP server carries them in ``params._meta``. OPA
with ``distributed_tracing`` configured then joins its spans to the gateway's trace
and writes ``trace_id`` and ``span_id`` into each decision log entry
(docs/operations.md); an upstream that reads ``_meta`` continues the trace. W3C Trace
Context explicitly, not the application's global propagator: OPA reads W3C headers
only (its server is instrumented with ``propagation.TraceContext``), and MCP's
convention names exactly these keys, so a global propagator set to B3, say, would
send OPA and upstreams headers they ignore. Never baggage: it carries whatever the
application (or its instrumentation) put in the context, and neither OPA nor an
upstream is told it. The MCP SDK's client injects the *global* propagator's fields
into each request's ``_meta`` itself (mcp 2.3, SEP-414), baggage included, so an
upstream call runs under :func:`without_baggage`. Without a valid current span, no
trace context is sent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")

__all__ = [
    "ATTRIBUTES",
    "annotate",
    "span",
    "start_span",
    "trace_context",
    "traced",
    "without_baggage",
]

try:
    from opentelemetry import baggage as _baggage
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the API comes with the mcp extra
    _trace = None  # type: ignore[assignment]
    _W3C = None
else:
    #: W3C Trace Context, whatever the application set as its global propagator.
    _W3C = TraceContextTextMapPropagator()

#: The attributes a capgate span may carry, and nothing else.
ATTRIBUTES: Final = frozenset(
    {
        "capgate.decision_id",
        "capgate.allow",
        "capgate.reason_codes",
        "capgate.tool",
        "capgate.tool_version",
        "capgate.operation_id",
        "capgate.stage",
        "capgate.status",
        "capgate.bundle_revision",
        "capgate.visible_count",
        "capgate.read_only",
    }
)

_Value = str | bool | int | float | Sequence[str]


def _tracer() -> Any:
    assert _trace is not None
    return _trace.get_tracer("capgate")


def _kept(attributes: dict[str, Any]) -> dict[str, _Value]:
    """``decision_id=...`` as ``capgate.decision_id``, if allowed and set."""
    kept: dict[str, _Value] = {}
    for short, value in attributes.items():
        name = f"capgate.{short}"
        if name not in ATTRIBUTES or value is None:
            continue
        if isinstance(value, tuple | list | frozenset | set):
            kept[name] = [str(item) for item in value]
        elif isinstance(value, str | bool | int | float):
            kept[name] = value
    return kept


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A current span named ``name`` around the block (a no-op without the API)."""
    if _trace is None:
        yield
        return
    with _tracer().start_as_current_span(name, attributes=_kept(attributes)):
        yield


def traced(name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Run the decorated method inside :func:`span` ``name``."""

    def decorate(method: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(method)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with span(name):
                return method(*args, **kwargs)

        return wrapper

    return decorate


def start_span(name: str, **attributes: Any) -> Any:
    """A span that is not made current (its owner ends it), or None without the API.
    For a store transaction, whose start and end are a context manager's two halves."""
    if _trace is None:
        return None
    return _tracer().start_span(name, attributes=_kept(attributes))


def annotate(**attributes: Any) -> None:
    """Set allowed attributes on the current span (``decision_id=`` sets
    ``capgate.decision_id``)."""
    if _trace is None:
        return
    current = _trace.get_current_span()
    if current.is_recording():
        current.set_attributes(_kept(attributes))


def trace_context() -> dict[str, str]:
    """The current span's W3C trace context: ``{"traceparent": ...}``, with
    ``"tracestate"`` when the span has one; empty without a valid current span or
    without the API. The same keys serve as HTTP headers (to OPA) and as MCP
    ``_meta`` keys (to upstreams); see the module docstring for why W3C and why
    nothing else."""
    if _W3C is None or not _trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier


@contextmanager
def without_baggage() -> Iterator[None]:
    """The block runs with no OpenTelemetry baggage in the current context (the trace
    context stays): whatever it starts, a task included, cannot pass baggage on. A
    no-op without the API."""
    if _trace is None:
        yield
        return
    token = _context.attach(_baggage.clear())
    try:
        yield
    finally:
        _context.detach(token)

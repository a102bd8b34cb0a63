"""The W3C trace context capgate passes on: to OPA as HTTP headers, exactly
``traceparent`` (and ``tracestate``) of the current span, and nothing without one.

In-process, without touching the global tracer provider: a span context made by hand
and made current with ``trace.use_span(NonRecordingSpan(...))`` is all the W3C
propagator reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from capgate.gateway.policy.client import PolicyClient
from capgate.gateway.tracing import trace_context
from tests.propagation import FOREIGN_KEY, FOREIGN_VALUE, install_b3_like

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#: The headers a decision's request carries without a span.
OWN_HEADERS = {"host", "accept-encoding", "content-type", "content-length"}


@contextmanager
def current_span(trace_state: TraceState | None = None) -> Iterator[None]:
    ctx = SpanContext(
        TRACE_ID,
        SPAN_ID,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=trace_state,
    )
    with trace.use_span(NonRecordingSpan(ctx)):
        yield


def recording_client() -> tuple[PolicyClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"result": "sha256:" + "ab" * 32})

    client = PolicyClient("http://127.0.0.1:8181", transport=httpx.MockTransport(handler))
    return client, seen


def extra_headers(request: httpx.Request) -> dict[str, str]:
    return {name: value for name, value in request.headers.items() if name not in OWN_HEADERS}


def test_without_a_span_there_is_no_trace_context() -> None:
    assert trace_context() == {}


def test_an_invalid_span_context_gives_none() -> None:
    with trace.use_span(NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)):
        assert trace_context() == {}


def test_a_span_gives_its_traceparent_and_tracestate() -> None:
    with current_span():
        assert trace_context() == {"traceparent": TRACEPARENT}
    with current_span(TraceState([("vendor", "x1")])):
        assert trace_context() == {"traceparent": TRACEPARENT, "tracestate": "vendor=x1"}


def asked(span: bool) -> list[httpx.Request]:
    """The requests of a decision and a health probe, in a span or not."""
    client, seen = recording_client()
    with client:
        if span:
            with current_span():
                client.catalogue_digest()
                client.health_problem(bundles=False)
        else:
            client.catalogue_digest()
            client.health_problem(bundles=False)
    assert len(seen) == 2
    return seen


def added(request: httpx.Request, control: httpx.Request) -> dict[str, str]:
    """The headers ``request`` carries that the same request without a span did not."""
    return {
        name: value for name, value in request.headers.items() if control.headers.get(name) != value
    }


def test_a_request_to_opa_without_a_span_carries_no_trace_header() -> None:
    for request in asked(span=False):
        assert "traceparent" not in request.headers
        assert "tracestate" not in request.headers


def test_a_request_to_opa_in_a_span_carries_exactly_its_traceparent() -> None:
    for request, control in zip(asked(span=True), asked(span=False), strict=True):
        assert added(request, control) == {"traceparent": TRACEPARENT}


def test_tracestate_goes_along_but_never_baggage() -> None:
    client, seen = recording_client()
    token = context.attach(baggage.set_baggage("user", "someone@example.com"))
    try:
        with client, current_span(TraceState([("vendor", "x1")])):
            client.catalogue_digest()
    finally:
        context.detach(token)
    (request,) = seen
    assert extra_headers(request) == {"traceparent": TRACEPARENT, "tracestate": "vendor=x1"}


def test_the_w3c_format_whatever_the_global_propagator(monkeypatch: pytest.MonkeyPatch) -> None:
    install_b3_like(monkeypatch)
    carrier: dict[str, str] = {}
    with current_span():
        propagate.inject(carrier)
    assert carrier == {FOREIGN_KEY: FOREIGN_VALUE}  # the control: the global one is B3
    client, seen = recording_client()
    with client, current_span():
        client.catalogue_digest()
    (request,) = seen
    assert extra_headers(request) == {"traceparent": TRACEPARENT}

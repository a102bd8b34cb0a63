"""The gateway's trace reaches a real OPA: in its decision log, and in its own spans.

Each test makes decisions inside a span context of its own, made current with
``trace.use_span(NonRecordingSpan(...))`` (the W3C propagator needs no tracer
provider, so the process's global one is left alone), against an OPA whose
distributed tracing exports to a stand-in OTLP/HTTP collector on 127.0.0.1
(:mod:`tests.integration.otlp_sink`); nothing is sent anywhere else.

- A deployed sidecar (``capgate deploy init --otlp-address``): the decision log entry
  of a decision made in the span carries its trace id, one made outside it does not;
  and OPA exports its server span as a child of ours.
- The embedded OPA with ``opa_tracing``: its decision log is dropped by design, so
  the proof is the exported span, in our trace and a child of our span.

OPA's batch span processor exports every 5 s; the waits are hang bounds, not paces.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from capgate import DecisionEvent, PolicySidecar
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.deploy import init_deployment
from capgate.gateway.opa.sidecar import read_token_file
from capgate.gateway.opa.traces import OPATracing
from capgate.gateway.state import open_store
from tests.hang import ANSWER_TIMEOUT, INNER_HANG_SECONDS
from tests.integration.deploy_support import (
    POLLING,
    agent_request,
    bundle_server,
    publish,
    sales_gateway,
    sidecar_opa,
    wait_until,
)
from tests.integration.otlp_sink import otlp_sink

pytestmark = pytest.mark.integration


@contextmanager
def our_span() -> Iterator[SpanContext]:
    """A sampled span context of random ids, current for the block."""
    ctx = SpanContext(
        int.from_bytes(secrets.token_bytes(16), "big") | 1,
        int.from_bytes(secrets.token_bytes(8), "big") | 1,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    with trace.use_span(NonRecordingSpan(ctx)):
        yield ctx


def trace_hex(ctx: SpanContext) -> str:
    return f"{ctx.trace_id:032x}"


def span_hex(ctx: SpanContext) -> str:
    return f"{ctx.span_id:016x}"


def test_a_deployed_sidecar_logs_the_decisions_trace_and_joins_it(
    tmp_path: Path, sales_catalogue: Catalogue
) -> None:
    events: list[DecisionEvent] = []
    with otlp_sink() as sink, bundle_server(tmp_path / "www") as server:
        deployment = init_deployment(
            tmp_path / "deploy",
            bundle_url=server.bundle_url,
            polling=POLLING,
            tracing=OPATracing(sink.address),
        )
        # The control: the configuration written is what turns it on.
        config = yaml.safe_load(deployment.opa_config.read_text())
        assert config["distributed_tracing"]["address"] == sink.address
        token = read_token_file(deployment.token_file)
        publish(server, deployment, sales_catalogue, [token])
        with sidecar_opa(deployment.opa_config, tmp_path / "opa.log") as opa:
            with PolicySidecar(
                sales_catalogue,
                opa_url=opa.address,
                token=token,
                timeout=ANSWER_TIMEOUT,
                startup_timeout=INNER_HANG_SECONDS,
            ) as sidecar:
                store = open_store(str(tmp_path / "state.db"))
                try:
                    gateway, _ = sales_gateway(
                        sales_catalogue, sidecar.client, store, observer=events.append
                    )
                    request = agent_request()
                    gateway.compose(request)  # outside any span
                    with our_span() as ours:
                        gateway.compose(request)
                finally:
                    store.close()
            outside, inside = (event.decision_id for event in events)
            logged = {}

            def both_logged() -> bool:
                for event in opa.decision_events():
                    if event.get("decision_id") in (outside, inside):
                        logged[event["decision_id"]] = event
                return len(logged) == 2

            wait_until(both_logged, "OPA logs both decisions")
            assert logged[inside]["trace_id"] == trace_hex(ours)
            # OPA's own server span, a child of ours: another span id.
            assert len(logged[inside]["span_id"]) == 16
            assert logged[inside]["span_id"] != span_hex(ours)
            assert logged[outside].get("trace_id") != trace_hex(ours)
            exported = bytes.fromhex(trace_hex(ours)), bytes.fromhex(span_hex(ours))
            wait_until(
                lambda: all(part in sink.received() for part in exported),
                "OPA exports its span in our trace, with our span as its parent",
            )


def test_the_embedded_opa_joins_the_trace_given_opa_tracing(sales_catalogue: Catalogue) -> None:
    with (
        otlp_sink() as sink,
        PolicySidecar(
            sales_catalogue,
            opa_tracing=OPATracing(sink.address),
            startup_timeout=INNER_HANG_SECONDS,
        ) as sidecar,
    ):
        assert sidecar.embedded
        with our_span() as ours:
            sidecar.client.catalogue_digest()
        exported = bytes.fromhex(trace_hex(ours)), bytes.fromhex(span_hex(ours))
        wait_until(
            lambda: all(part in sink.received() for part in exported),
            "the embedded OPA exports its span in our trace, a child of our span",
            seconds=INNER_HANG_SECONDS,
        )

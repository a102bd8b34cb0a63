"""The gateway's trace goes on to upstream MCP servers, in ``params._meta``, and
nothing else of the caller's goes with it.

The upstream is the test's own server (mcp_upstream_server.py) with a tool that
answers with the ``_meta`` it received, over stdio and over streamable HTTP on
127.0.0.1, behind a real OPA:

- in this process, without a tracer provider: a span context made current with
  ``trace.use_span(NonRecordingSpan(...))`` reaches the upstream as ``traceparent``
  (and ``tracestate``), while baggage in the same context does not; without a span,
  no trace context is sent;
- in a child process with the SDK (mcp_trace_child.py), through capgate's MCP front:
  the upstream's parent is the MCP SDK's client span, a child of ``capgate.tool``, in
  the MCP client's trace; the baggage and the other key of the client's ``_meta``
  never reach the upstream.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from capgate.adapters.tools.mcp.config import ServerSpec
from capgate.gateway.model.outcomes import Outcome
from tests.hang import HANG_SECONDS
from tests.integration.mcp_upstream_support import (
    SERVER_SCRIPT,
    Harness,
    contract,
    free_port,
    own_server,
    upstream_tool,
    wait_for,
    write_spec,
)
from tests.propagation import FOREIGN_KEY, FOREIGN_VALUE, install_b3_like

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
META_TOOL = upstream_tool("meta", "Says what _meta it got.", {"meta": True})
SECRET = "baggage-never-upstream-5be0"


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def upstream(tmp_path: Path, transport: str) -> Iterator[ServerSpec]:
    spec = write_spec(tmp_path / "spec.json", [META_TOOL])
    if transport == "stdio":
        yield own_server("test", spec)
        return
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), str(spec), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _listening(port), what="the HTTP server")
        yield ServerSpec("test", url=f"http://127.0.0.1:{port}/mcp")
    finally:
        process.terminate()
        process.wait(timeout=HANG_SECONDS)


def received_meta(harness: Harness) -> dict[str, Any]:
    """The ``_meta`` the upstream received for one call of ``test.meta``."""
    outcome = harness.gateway.call(harness.request("reader"), "test.meta", {})
    assert isinstance(outcome, Outcome), outcome
    assert outcome.ok, outcome
    assert outcome.result is not None
    meta: dict[str, Any] = outcome.result["meta"]
    return meta


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_the_calls_span_reaches_the_upstream_and_its_baggage_does_not(
    tmp_path: Path, transport: str
) -> None:
    ours = SpanContext(
        int.from_bytes(secrets.token_bytes(16), "big") | 1,
        int.from_bytes(secrets.token_bytes(8), "big") | 1,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "x1")]),
    )
    tools = [contract("test.meta", "test", "meta")]
    with upstream(tmp_path, transport) as server, Harness(tmp_path, tools, [server]) as harness:
        harness.discover("test")
        harness.accept("test", "meta", "test.meta")
        without = received_meta(harness)
        token = context.attach(baggage.set_baggage("user.secret", SECRET))
        try:
            with trace.use_span(NonRecordingSpan(ours)):
                within = received_meta(harness)
        finally:
            context.detach(token)
    # No span, no trace context.
    assert "traceparent" not in without
    assert "tracestate" not in without
    # In a span: its trace, and (no tracer provider, so every span on the way is a
    # no-op carrying the context it was given) its very span id and tracestate.
    assert within["traceparent"] == f"00-{ours.trace_id:032x}-{ours.span_id:016x}-01"
    assert within["tracestate"] == "vendor=x1"
    assert "baggage" not in within
    assert SECRET not in json.dumps(within)
    # Nothing else differs between the two calls' _meta.
    assert {k: v for k, v in within.items() if k not in ("traceparent", "tracestate")} == without


def test_the_w3c_keys_go_whatever_the_global_propagator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MCP SDK injects the global propagator's fields; capgate's W3C keys are
    there besides them (they are capgate's, not the SDK's, here)."""
    install_b3_like(monkeypatch)
    ours = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=False)
    tools = [contract("test.meta", "test", "meta")]
    with upstream(tmp_path, "stdio") as server, Harness(tmp_path, tools, [server]) as harness:
        harness.discover("test")
        harness.accept("test", "meta", "test.meta")
        with trace.use_span(NonRecordingSpan(ours)):
            within = received_meta(harness)
    assert within[FOREIGN_KEY] == FOREIGN_VALUE  # the control: the SDK used the global one
    assert within["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


def test_through_the_front_the_upstream_continues_capgate_tool(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.mcp_trace_child", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    meta = report["answer"]["meta"]
    by_id = {span["id"]: span for span in report["spans"]}
    version, trace_id, parent_id, flags = meta["traceparent"].split("-")
    assert (version, flags) == ("00", "01")
    # The upstream's parent: the MCP SDK's client span, a child of capgate.tool, in
    # the trace the MCP client started (its traceparent continued by the front).
    sent = by_id[parent_id]
    assert sent["name"] == "MCP send tools/call meta"
    tool = by_id[sent["parent"]]
    assert tool["name"] == "capgate.tool"
    assert trace_id == tool["trace"] == sent["trace"] == "0af7651916cd43dd8448eb211c80319c"
    # The client's own tracestate goes with its trace; its baggage and its other key
    # do not.
    assert meta["tracestate"] == "agent=1"
    assert "baggage" not in meta
    assert "x-agent/secret" not in meta
    assert report["secret"] not in json.dumps(meta)

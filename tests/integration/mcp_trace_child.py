"""The child process of tests/integration/test_mcp_upstream_trace.py: an OpenTelemetry
SDK with the in-memory exporter, capgate's MCP server in-process over a gateway whose
tool runs on the test's own upstream server (``{"meta": true}``: it answers with the
``_meta`` it received); one call by the official client, which sends a ``_meta`` of
its own (a traceparent and a key of its own). Prints the finished spans and what the
upstream received, as JSON.

A process of its own for the reason tracing_child.py gives: the tracer provider is
set once per process.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.client.client import Client
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from capgate.adapters.fronts.mcp.config import Binding
from capgate.adapters.fronts.mcp.server import GatewayMCP
from tests.integration.mcp_upstream_support import (
    Harness,
    contract,
    own_server,
    upstream_tool,
    write_spec,
)

#: What the MCP client puts in its request's ``_meta``: its own trace, which the
#: gateway continues, and baggage and a key of its own, which must not reach the
#: upstream.
AGENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
SECRET = "agent-meta-never-upstream-41d2"
AGENT_META = {
    "traceparent": f"00-{AGENT_TRACE}-b7ad6b7169203331-01",
    "tracestate": "agent=1",
    "baggage": f"agent.secret={SECRET}",
    "x-agent/secret": SECRET,
}


def main(folder: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    spec = write_spec(
        folder / "spec.json", [upstream_tool("meta", "Says what _meta it got.", {"meta": True})]
    )
    with (
        contextlib.redirect_stdout(sys.stderr),  # stdout is the JSON
        Harness(folder, [contract("test.meta", "test", "meta")], [own_server("test", spec)]) as h,
    ):
        h.discover("test")
        h.accept("test", "meta", "test.meta")
        request = h.request("reader").model_dump(mode="json", exclude_none=True)
        binding = Binding.model_validate(request)
        service = GatewayMCP(h.gateway, stdio=binding)

        async def call() -> Any:
            async with Client(service.server) as client:
                result = await client.call_tool("test.meta", {}, meta=AGENT_META)
                return result.structured_content

        answer = anyio.run(call)
    spans = [
        {
            "name": s.name,
            "trace": f"{s.context.trace_id:032x}",
            "id": f"{s.context.span_id:016x}",
            "parent": f"{s.parent.span_id:016x}" if s.parent is not None else None,
        }
        for s in exporter.get_finished_spans()
    ]
    json.dump({"answer": answer, "spans": spans, "secret": SECRET}, sys.stdout)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

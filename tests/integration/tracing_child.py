"""The child process of tests/integration/test_tracing.py: an OpenTelemetry SDK with
the in-memory exporter, capgate's MCP server in-process, two calls by the official
client; it prints the finished spans and the calls' facts as JSON.

A process of its own, because OpenTelemetry's tracer provider is set once per
process: set in the test runner, it would make every later test's MCP client trace
(and send its own ``traceparent``).
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
from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.credentials import StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state import open_store
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import INNER_HANG_SECONDS
from tests.integration.mcp_server_support import SALES_BOT, seed_store

SECRET = "crm-secret-never-in-a-span-77c1"


def main(folder: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    with contextlib.redirect_stdout(sys.stderr):  # the CLI's lines: stdout is the JSON
        store = open_store(seed_store(folder / "state.db"))
    credentials = StaticCredentials({("acme", "crm"): SECRET})
    with PolicySidecar(catalogue, timeout=INNER_HANG_SECONDS) as sidecar:
        gateway = Gateway(
            catalogue, sidecar.client, ToolRegistry(SalesDesk().tools()), store,
            credentials=credentials,
        )  # fmt: skip
        service = GatewayMCP(gateway, stdio=Binding.model_validate(SALES_BOT))

        async def calls() -> list[dict[str, Any]]:
            async with Client(service.server) as client:
                read = await client.call_tool("contact.read", {"contact_id": "c-42"})
                denied = await client.call_tool("contact.read", {"contact_id": "c-nobody"})
                return [dict(r.meta or {})["capgate/outcome"] for r in (read, denied)]

        outcomes = anyio.run(calls)
    store.close()
    spans = [
        {
            "name": s.name,
            "trace": f"{s.context.trace_id:032x}",
            "id": f"{s.context.span_id:016x}",
            "parent": f"{s.parent.span_id:016x}" if s.parent is not None else None,
            "attributes": dict(s.attributes or {}),
        }
        for s in exporter.get_finished_spans()
    ]
    json.dump({"outcomes": outcomes, "spans": spans, "secret": SECRET}, sys.stdout, default=list)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

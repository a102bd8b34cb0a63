"""A small MCP server that capgate's upstream tests drive: its tools come from a file.

    python tests/integration/mcp_upstream_server.py SPEC.json [--started FILE] [--calls FILE]
        [--http PORT]

``SPEC.json`` is ``{"tools": [{"name", "description", "inputSchema", ...,
"behaviour": {...}}]}``: each tool's MCP definition (``title``, ``outputSchema`` and
``annotations`` optional) and what a call of it does:

- ``{"text": "..."}``: answer with that text content;
- ``{"structured": {...}}``: answer with that structured content (and its JSON as text);
- ``{"echo": true}``: answer with the arguments as structured content;
- ``{"error": "..."}``: answer with a tool error (``isError``) carrying that text;
- ``{"sleep": seconds}``: wait that long first (combined with one of the others);
- ``{"exit": code}``: the process dies while the call is in flight;
- ``{"malformed": true}``: answer the call with a result that is not a CallToolResult;
- ``{"meta": true}``: answer with the request's ``_meta`` as it arrived (``{}`` when
  it had none), as structured content ``{"meta": {...}}``.

The server reads the file at every listing and call, and polls it every 20 ms: when
it changes, it tells every client so: ``notifications/tools/list_changed`` to each
handshake-era session that listed its tools, and a tools-changed event on every
``subscriptions/listen`` stream of a 2026-07-28 connection. A test changes a running
server's tool definition by rewriting the file.

``--started FILE`` appends the server's pid to FILE when it starts, and ``--calls
FILE`` a line ``<tool> <arguments as JSON>`` for every call it receives: a test that a
denied call never starts or reaches a server reads them. ``--http PORT`` serves
streamable HTTP on 127.0.0.1 instead of stdio.

Written with the official SDK's low-level ``Server``, which capgate's code never uses:
the test sees capgate from the outside, as any server would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged

POLL_SECONDS = 0.02
#: The protocol's own stdout, kept before the SDK diverts fd 1 (so that a stray print
#: cannot corrupt the stream): ``malformed`` writes a bad answer straight onto it.
WIRE = os.dup(1)


class Upstream:
    def __init__(self, spec: Path, calls: Path | None) -> None:
        self.spec = spec
        self.calls = calls
        self.text = spec.read_text(encoding="utf-8")
        self.bus = InMemorySubscriptionBus()
        self.sessions: list[ServerSession] = []

    def tools(self) -> dict[str, dict[str, Any]]:
        """The tools as the file says now (a listing never shows a stale definition)."""
        try:
            text = self.spec.read_text(encoding="utf-8")
            tools = {tool["name"]: tool for tool in json.loads(text)["tools"]}
        except (OSError, ValueError, KeyError):
            return {tool["name"]: tool for tool in json.loads(self.text)["tools"]}
        return tools

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if ctx.session not in self.sessions:
            self.sessions.append(ctx.session)
        listed = []
        for tool in self.tools().values():
            definition = {k: v for k, v in tool.items() if k != "behaviour"}
            listed.append(types.Tool.model_validate(definition))
        return types.ListToolsResult(tools=listed)

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = params.arguments or {}
        if self.calls is not None:
            with self.calls.open("a", encoding="utf-8") as log:
                log.write(f"{params.name} {json.dumps(arguments, sort_keys=True)}\n")
        tool = self.tools().get(params.name)
        if tool is None:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"no tool {params.name}")],
                is_error=True,
            )
        behaviour = tool.get("behaviour", {})
        if "sleep" in behaviour:
            await anyio.sleep(float(behaviour["sleep"]))
        if "exit" in behaviour:
            os._exit(int(behaviour["exit"]))
        if behaviour.get("malformed"):
            # A response for this request that no CallToolResult fits, written past the
            # SDK; its own answer afterwards is for a request the client forgot.
            bad = {"jsonrpc": "2.0", "id": ctx.request_id, "result": {"content": 42}}
            os.write(WIRE, (json.dumps(bad) + "\n").encode())
            await anyio.sleep(3600)
        if "error" in behaviour:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=behaviour["error"])], is_error=True
            )
        if "text" in behaviour:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=behaviour["text"])]
            )
        if behaviour.get("meta"):
            received = params.model_dump(by_alias=True, exclude_none=True).get("_meta", {})
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=json.dumps({"meta": received}))],
                structured_content={"meta": received},
            )
        structured = arguments if behaviour.get("echo") else behaviour.get("structured", {})
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(structured))],
            structured_content=structured,
        )

    async def watch(self) -> None:
        """Re-read the spec when it changes, and tell every client its tools changed."""
        while True:
            await anyio.sleep(POLL_SECONDS)
            try:
                text = self.spec.read_text(encoding="utf-8")
                json.loads(text)
            except (OSError, ValueError):
                continue  # being rewritten: look again at the next beat
            if text == self.text:
                continue
            self.text = text
            await self.bus.publish(ToolsListChanged())
            for session in list(self.sessions):
                try:
                    await session.send_tool_list_changed()
                except Exception:  # a session that is gone, or of the 2026 era
                    self.sessions.remove(session)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", type=Path)
    parser.add_argument("--started", type=Path)
    parser.add_argument("--calls", type=Path)
    parser.add_argument("--http", type=int)
    args = parser.parse_args()
    if args.started is not None:
        with args.started.open("a", encoding="utf-8") as started:
            started.write(f"{os.getpid()}\n")
    upstream = Upstream(args.spec, args.calls)
    server: Server[Any] = Server(
        "capgate-test-upstream",
        version="1.0",
        on_list_tools=upstream.list_tools,
        on_call_tool=upstream.call_tool,
        on_subscriptions_listen=ListenHandler(upstream.bus),
    )
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))

    async def serve_stdio() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(upstream.watch)
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, options)
            tasks.cancel_scope.cancel()

    async def serve_http(port: int) -> None:
        import uvicorn

        app = server.streamable_http_app(host="127.0.0.1")
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(upstream.watch)
            await uvicorn.Server(config).serve()
            tasks.cancel_scope.cancel()

    if args.http is not None:
        anyio.run(serve_http, args.http)
    else:
        anyio.run(serve_stdio)
    sys.exit(0)


if __name__ == "__main__":
    main()

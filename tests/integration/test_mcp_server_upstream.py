"""``capgate serve`` in front of an upstream MCP server whose definition changes.

The two directions of MCP meet here: a real MCP client talks to ``capgate serve``,
which runs the tool on an upstream MCP server (the test's own, whose definition the
test rewrites while both run). A changed definition must reach the client as
``notifications/tools/list_changed`` with the tool gone (quarantined), its call must
be answered like a missing tool's, and a person's acceptance must bring it back,
announced the same way.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import yaml
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from capgate import open_store
from capgate.adapters.tools.in_process import InProcessTools
from tests.hang import HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.mcp_upstream_support import (
    SERVER_SCRIPT,
    contract,
    upstream_tool,
    write_catalogue,
    write_spec,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CAPGATE = ROOT / ".venv" / "bin" / "capgate"
#: The test's own bound, under pytest's timeout: nothing may hang (tests/hang.py).
BOUND = HANG_SECONDS


class NoTools:
    """The configuration's ``tools`` entry point: no in-process tool at all."""

    @staticmethod
    def tools() -> InProcessTools:
        return InProcessTools()


def _echo(version: int) -> dict[str, Any]:
    return upstream_tool(
        "echo",
        f"Echo the message back (version {version}).",
        {"echo": True},
        input_schema={"type": "object", "properties": {"message": {"type": "string"}}},
        output_schema={"type": "object"},
    )


def _config(path: Path, servers: str) -> Path:
    document = {
        "tools": f"{__name__}:NoTools",
        "upstreams": servers,
        "list_changed_poll_seconds": 0.2,
        "stdio": {
            "principal": {"agent": "reader-bot", "role": "reader", "tenant": "acme"},
            "task": {"type": "ops", "id": "task-1"},
            "environment": "production",
        },
    }
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    path.chmod(0o600)
    return path


def _capgate(*args: str) -> str:
    done = subprocess.run(
        [str(CAPGATE), *args], capture_output=True, text=True, timeout=INNER_HANG_SECONDS, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _accept(store: str, catalogue: Path) -> str:
    """Accept the definition the server shows now, as a reviewer does; its digest."""
    opened = open_store(store)
    try:
        with opened.transaction(read_only=True) as tx:
            pin = tx.get_pin("test", "echo")
    finally:
        opened.close()
    assert pin is not None
    assert pin.observed_digest is not None
    _capgate("mcp", "accept", "test", "echo", "--as", "test.echo", "--catalogue",
             str(catalogue), "--digest", pin.observed_digest, "--by", "maria",
             "--store", store)  # fmt: skip
    return pin.observed_digest


def test_a_quarantined_upstream_tool_leaves_the_servers_list_until_accepted(tmp_path: Path):
    spec = write_spec(tmp_path / "spec.json", [_echo(1)])
    catalogue = write_catalogue(tmp_path / "catalogue", [contract("test.echo", "test", "echo")])
    store = str(tmp_path / "state.db")
    _capgate("tenants", "add", "acme", "--budget-class", "standard", "--store", store)
    servers = f"test={shlex.join([sys.executable, str(SERVER_SCRIPT), str(spec)])}"
    _capgate("mcp", "discover", "--servers", servers, "--store", store)
    first = _accept(store, catalogue)
    second = ""
    config = _config(tmp_path / "serve.yaml", servers)
    changes = 0
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        nonlocal changes
        if isinstance(message, types.ToolListChangedNotification):
            changes += 1
            changed.set()

    async def names(client: Client) -> list[str]:
        """The catalogue's tools listed (the server's own capgate.* tools, always there,
        left out: test_mcp_review_tools.py covers them)."""
        listed = [tool.name for tool in (await client.list_tools()).tools]
        assert "capgate.proposals.status" in listed
        return [name for name in listed if not name.startswith("capgate.")]

    async def test() -> None:
        nonlocal changed, second
        params = StdioServerParameters(
            command=str(CAPGATE),
            args=[
                "serve",
                "--catalogue",
                str(catalogue),
                "--store",
                store,
                "--config",
                str(config),
                "--stdio",
                "--log-level",
                "debug",
            ],
            env={k: v for k, v in os.environ.items() if k != "CAPGATE_OPA_URL"}
            | {"PYTHONPATH": str(ROOT)},
            cwd=str(ROOT),
        )
        with (tmp_path / "serve.log").open("a", encoding="utf-8") as errlog:
            transport = stdio_client(params, errlog=errlog)
            async with Client(transport, mode="legacy", message_handler=on_message) as client:
                assert await names(client) == ["test.echo"]
                one = await client.call_tool("test.echo", {"message": "one"})
                assert one.is_error is False, one
                assert one.structured_content == {"message": "one"}

                # Upstream, the definition changes while the session is open.
                write_spec(spec, [_echo(2)])
                with anyio.fail_after(INNER_HANG_SECONDS):
                    await changed.wait()
                assert await names(client) == []
                denied = await client.call_tool("test.echo", {"message": "two"})
                missing = await client.call_tool("no.such.tool", {"message": "two"})
                assert denied.is_error is True
                assert denied.model_dump_json() == missing.model_dump_json()

                # A person accepts version 2: announced, listed and callable again.
                changed = anyio.Event()
                second = await anyio.to_thread.run_sync(_accept, store, catalogue)
                assert second != first
                with anyio.fail_after(INNER_HANG_SECONDS):
                    await changed.wait()
                assert await names(client) == ["test.echo"]
                three = await client.call_tool("test.echo", {"message": "three"})
                assert three.structured_content == {"message": "three"}

    async def run() -> None:
        with anyio.fail_after(BOUND):
            await test()

    anyio.run(run)
    assert changes >= 2
    # Every call that ran names the definition it ran under.
    opened = open_store(store)
    try:
        ran = [
            (r.detail.get("definition"), r.outcome)
            for r in opened.ledger()
            if r.kind == "outcome" and r.tool == "test.echo"
        ]
    finally:
        opened.close()
    assert ran == [(first, "success"), (second, "success")]

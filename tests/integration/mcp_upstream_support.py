"""What the upstream MCP tests share: the peers, catalogues in tmp, a gateway harness.

The real peers (``@modelcontextprotocol/server-everything``,
``@modelcontextprotocol/server-filesystem``, ``mcp-server-time``, ``mcp-server-git``)
are installed by ``make setup-test`` into ``.tools/mcp-peers`` at the pins of
``scripts/versions.env``; a test that needs one fails (never skips) when it is not
there. ``mcp_upstream_server.py`` is the test's own server, whose tools a test can
change while it runs.

:class:`Harness` is one gateway over a catalogue written to tmp: a real OPA
(:class:`capgate.PolicySidecar`), a SQLite store,
:class:`capgate.adapters.tools.mcp.client.McpTools` for the given servers (stdio, or
streamable HTTP on 127.0.0.1) and, optionally, in-process tools. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from capgate import (
    AgentRequest,
    Gateway,
    PolicySidecar,
    StaticCredentials,
    ToolRegistry,
    load_catalogue,
    open_store,
)
from capgate.adapters.tools.in_process import InProcessTools
from capgate.adapters.tools.mcp.client import McpTools
from capgate.adapters.tools.mcp.config import ServerSpec
from capgate.cli.main import main
from capgate.gateway.model.decisions import ComposeDecision
from capgate.gateway.state.records import PinRecord
from tests.hang import ANSWER_TIMEOUT, INNER_HANG_SECONDS

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / ".tools" / "mcp-peers"
SERVER_SCRIPT = Path(__file__).resolve().parent / "mcp_upstream_server.py"

EVERYTHING = PEERS / "node_modules" / ".bin" / "mcp-server-everything"
FILESYSTEM = PEERS / "node_modules" / ".bin" / "mcp-server-filesystem"
TIME = PEERS / "venv" / "bin" / "mcp-server-time"
GIT = PEERS / "venv" / "bin" / "mcp-server-git"


def require_peers(*programs: Path) -> None:
    """Fail (not skip) when set-up has not installed a peer the test runs."""
    missing = [str(p.relative_to(ROOT)) for p in programs if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"MCP peers missing: {', '.join(missing)}; run `make setup-test`")


def wait_for(
    predicate: Callable[[], Any], timeout: float = INNER_HANG_SECONDS, what: str = "it"
) -> Any:
    """Poll ``predicate`` until it returns something true; fail after ``timeout`` (a
    hang bound, tests/hang.py, never a pace)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout}s for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ConnectionCounter:
    """A TCP listener on 127.0.0.1 that only counts the connections it accepts."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(16)
        self._socket.settimeout(0.1)
        self.port: int = self._socket.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            connection.close()  # not an MCP server: the client's request fails at once

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()


# -- catalogues -----------------------------------------------------------------------------

ROLES = {
    "reader": {"description": "Reads through upstream tools; writes nothing."},
    "writer": {"description": "Reads and writes through upstream tools."},
}


def contract(
    name: str,
    server: str | None,
    tool: str | None,
    *,
    roles: Sequence[str] = ("reader", "writer"),
    mode: str = "read",
    idempotency: str = "idempotent",
    input_schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    connection_alias: str | None = None,
    recovery: str = "retry_safe",
    description: str | None = None,
) -> dict[str, Any]:
    """A catalogue tool entry (tools.yaml) running ``tool`` of ``server``."""
    entry: dict[str, Any] = {
        "name": name,
        "version": 1,
        "description": description or f"The upstream tool {tool} of server {server}.",
        "mode": mode,
        "roles": list(roles),
        "connection_alias": connection_alias,
        "subject_type": None,
        "approval": "none",
        "recovery": recovery,
        "idempotency": idempotency,
        "cost_class": "free",
        "input_schema": input_schema or {"type": "object"},
        "output_schema": output_schema or {"type": "object"},
        "environments": ["production"],
    }
    if server is not None:
        entry["upstream"] = {"server": server, "tool": tool}
    return entry


def write_catalogue(
    folder: Path, tools: Sequence[dict[str, Any]], roles: dict[str, Any] | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "tools.yaml": {"tools": list(tools)},
        "roles.yaml": {"roles": roles or ROLES},
        "task_types.yaml": {
            "task_types": {
                "ops": {
                    "description": "Work through upstream tools.",
                    "tools": [t["name"] for t in tools],
                }
            }
        },
        "budget_classes.yaml": {
            "budget_classes": {"standard": {"description": "Everyday.", "max_cost_class": "medium"}}
        },
    }
    for name, document in files.items():
        (folder / name).write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return folder


def upstream_tool(
    name: str,
    description: str,
    behaviour: dict[str, Any],
    *,
    input_schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    annotations: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A tool of the test's own server (mcp_upstream_server.py's SPEC entries)."""
    tool: dict[str, Any] = {
        "name": name,
        "description": description,
        "inputSchema": input_schema or {"type": "object"},
        "behaviour": behaviour,
    }
    if output_schema is not None:
        tool["outputSchema"] = output_schema
    if annotations is not None:
        tool["annotations"] = annotations
    return tool


def write_spec(path: Path, tools: Sequence[dict[str, Any]]) -> Path:
    """Write the test server's spec atomically (it polls the file)."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps({"tools": list(tools)}), encoding="utf-8")
    os.replace(scratch, path)
    return path


def own_server(
    server_id: str, spec: Path, *, started: Path | None = None, calls: Path | None = None
) -> ServerSpec:
    """The stdio spec of the test's own server."""
    command = [sys.executable, str(SERVER_SCRIPT), str(spec)]
    if started is not None:
        command += ["--started", str(started)]
    if calls is not None:
        command += ["--calls", str(calls)]
    return ServerSpec(server_id, command=tuple(command))


# -- the harness -----------------------------------------------------------------------------


class Harness:
    """A gateway over a catalogue in ``folder``, with MCP servers and a real OPA."""

    def __init__(
        self,
        folder: Path,
        tools: Sequence[dict[str, Any]],
        servers: Iterable[ServerSpec],
        *,
        roles: dict[str, Any] | None = None,
        in_process: InProcessTools | None = None,
        # The gateway's deadlines for a server to start and a tool to answer: the hang
        # bound, unless a test's subject is one of them (then it gives its own).
        call_timeout: float = INNER_HANG_SECONDS,
        connect_timeout: float = INNER_HANG_SECONDS,
        mode: str = "auto",
        credentials: dict[tuple[str, str], str] | None = None,
        connections: Sequence[str] = (),
        opa_url: str | None = None,
        catalogue_dir: Path | None = None,
        unplaced: bool = False,
    ) -> None:
        self.folder = folder
        self.catalogue_dir = catalogue_dir or write_catalogue(folder / "catalogue", tools, roles)
        self.catalogue = load_catalogue(self.catalogue_dir)
        self.store_path = str(folder / "state.db")
        self.store = open_store(self.store_path)
        with self.store.transaction() as tx:
            tx.put_tenant("acme", budget_class="standard", budget_limit=None)
            for alias in connections:
                tx.put_connection("acme", alias, status="active", account=f"{alias}@acme")
        self.errlog = (folder / "servers.log").open("w", encoding="utf-8")
        self.mcp = McpTools(
            self.catalogue,
            servers,
            self.store,
            call_timeout=call_timeout,
            connect_timeout=connect_timeout,
            errlog=self.errlog,
            mode=mode,
            unplaced=unplaced,
        )
        self.sidecar = PolicySidecar(self.catalogue, timeout=ANSWER_TIMEOUT, opa_url=opa_url)
        self.sidecar.__enter__()
        adapters = [self.mcp] if in_process is None else [self.mcp, in_process]
        self.gateway = Gateway(
            self.catalogue,
            self.sidecar.client,
            ToolRegistry(*adapters),
            self.store,
            credentials=StaticCredentials(credentials or {}),
        )

    def request(self, role: str, agent: str | None = None) -> AgentRequest:
        return AgentRequest.model_validate(
            {
                "principal": {"agent": agent or f"{role}-bot", "role": role, "tenant": "acme"},
                "task": {"type": "ops", "id": "task-1"},
                "environment": "production",
            }
        )

    def compose(self, role: str) -> ComposeDecision:
        return self.gateway.compose(self.request(role), reasons=True)

    def cli(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        """``capgate ARGS --store <this store>``: its exit status and its output."""
        out = io.StringIO()
        saved = dict(os.environ)
        try:
            os.environ.update(env or {})
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = main([*args, "--store", self.store_path])
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return code, out.getvalue()

    def pin(self, server: str, tool: str) -> PinRecord | None:
        with self.store.transaction(read_only=True) as tx:
            return tx.get_pin(server, tool)

    def discover(self, *server_ids: str) -> None:
        self.mcp.discover(server_ids or None)

    def accept(self, server: str, tool: str, as_tool: str) -> PinRecord:
        """Discovered already; accept through the command line, as a reviewer would."""
        pin = self.pin(server, tool)
        assert pin is not None, f"{server} {tool} was not discovered"
        code, out = self.cli(
            "mcp",
            "accept",
            server,
            tool,
            "--as",
            as_tool,
            "--catalogue",
            str(self.catalogue_dir),
            "--digest",
            str(pin.observed_digest),
            "--by",
            "maria",
        )
        assert code == 0, out
        accepted = self.pin(server, tool)
        assert accepted is not None
        return accepted

    def close(self) -> None:
        self.mcp.close()
        self.sidecar.__exit__(None, None, None)
        self.store.close()
        self.errlog.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

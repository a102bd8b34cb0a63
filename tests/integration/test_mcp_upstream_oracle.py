"""The oracle over MCP: the same function, the same omen, the same events.

``python -m capgate.demo.oracle_server`` serves the demo's oracle function over MCP.
For a given seed the omen drawn through it (stdio, and streamable HTTP on 127.0.0.1)
is byte-identical to the in-process one, and the oracle-grove scene records the same
decisions and ledger rows in both modes, apart from the definition digest only an
upstream tool has. ``MCP_ORACLE=1`` is the gate's shorthand for that server, and is
ignored when ``MCP_SERVERS`` is set.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from capgate import (
    AgentRequest,
    AgentSession,
    Gateway,
    PolicySidecar,
    ToolRegistry,
    open_store,
)
from capgate.adapters.tools.mcp.config import ServerSpec, servers_from_env
from capgate.adapters.tools.mcp.pins import accept_definition
from capgate.demo import demo_catalogue_dir
from capgate.demo.oracle_server import ORACLE_SERVER_ID, oracle_server_spec
from capgate.demo.scenes import run_oracle_grove
from capgate.demo.tools.oracle import oracle
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.model.contracts import Catalogue, UpstreamRef
from capgate.gateway.state.records import PinStatus
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.mcp_upstream_support import free_port, wait_for

pytestmark = pytest.mark.integration


def _oracle_over_mcp(catalogue: Catalogue) -> Catalogue:
    """The oracle-grove catalogue with its oracle placed on the oracle server by an
    ``upstream`` (the demo leaves it unplaced and lets the MCP gate place it)."""
    tools = catalogue.model_dump()["tools"]
    tools["oracle"]["upstream"] = UpstreamRef(server=ORACLE_SERVER_ID, tool="oracle").model_dump()
    return Catalogue.model_validate({**catalogue.model_dump(), "tools": tools})


def test_the_oracle_grove_records_identical_events_in_both_modes():
    out = io.StringIO()
    status, in_process = run_oracle_grove(out, over_mcp=False)
    assert status == 0, out.getvalue()
    status, over_mcp = run_oracle_grove(out, over_mcp=True)
    assert status == 0, out.getvalue()
    assert in_process.omen == oracle("harvest-moon")["omen"]
    assert over_mcp.omen is not None
    assert over_mcp.omen.encode("utf-8") == in_process.omen.encode("utf-8")
    assert over_mcp.events == in_process.events
    assert over_mcp.ledger == in_process.ledger
    kinds = [row[0] for row in in_process.ledger]
    assert kinds.count("intent") == kinds.count("outcome") == 2
    assert "decision" in kinds  # the scene-whisperer's denial
    assert in_process.definitions == set()
    assert len(over_mcp.definitions) == 1  # both calls ran under the accepted definition


def test_mcp_oracle_is_the_gates_shorthand_for_the_oracle_server():
    spec = oracle_server_spec()
    assert servers_from_env({}, oracle=spec) == []  # the offline default: in-process
    assert servers_from_env({"MCP_ORACLE": "1"}, oracle=spec) == [spec]
    assert spec.command == (sys.executable, "-m", "capgate.demo.oracle_server")
    listed = servers_from_env({"MCP_ORACLE": "1", "MCP_SERVERS": "t=python -m x"}, oracle=spec)
    assert [s.id for s in listed] == ["t"]


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_the_omen_over_each_transport_is_the_in_process_one(tmp_path: Path, transport: str):
    from capgate.adapters.tools.mcp.client import McpTools

    catalogue = _oracle_over_mcp(load_catalogue(demo_catalogue_dir("oracle-grove")))
    process = None
    spec = oracle_server_spec()
    if transport == "streamable-http":
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "capgate.demo.oracle_server", "--http", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        spec = ServerSpec(ORACLE_SERVER_ID, url=f"http://127.0.0.1:{port}/mcp")
    store = open_store(str(tmp_path / "state.db"))
    tools = McpTools(
        catalogue,
        [spec],
        store,
        connect_timeout=INNER_HANG_SECONDS,
        call_timeout=INNER_HANG_SECONDS,
    )
    try:
        with store.transaction() as tx:
            tx.put_tenant("grove", budget_class="standard", budget_limit=None)
        if process is not None:
            wait_for(lambda: _listing(tools), what="the oracle's HTTP server")
        else:
            tools.discover()
        pin = accept_definition(
            store, catalogue, ORACLE_SERVER_ID, "oracle", as_tool="oracle", digest=None, by="maria"
        )
        assert pin.status is PinStatus.ACCEPTED
        with PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
            gateway = Gateway(catalogue, sidecar.client, ToolRegistry(tools), store)
            teller = AgentSession(
                gateway,
                AgentRequest.model_validate(
                    {
                        "principal": {"agent": "ft", "role": "fortune-teller", "tenant": "grove"},
                        "task": {"type": "scene", "id": "scene-1"},
                        "environment": "development",
                    }
                ),
            )
            for seed in ("harvest-moon", "ünïcödé ☾", "a" * 300):
                assert teller.call_tool("oracle", seed=seed) == oracle(seed)
    finally:
        tools.close()
        store.close()
        if process is not None:
            process.terminate()
            process.wait(timeout=HANG_SECONDS)  # no kill() after it: it must end


def _listing(tools: object) -> bool:
    from capgate.gateway.errors import UpstreamUnavailable

    try:
        tools.discover()  # type: ignore[attr-defined]
    except UpstreamUnavailable:
        return False
    return True


def test_the_oracle_server_refuses_a_non_loopback_address():
    done = subprocess.run(
        [sys.executable, "-m", "capgate.demo.oracle_server", "--http", "0.0.0.0:8931"],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )
    assert done.returncode != 0
    assert "127.0.0.1:PORT" in done.stderr

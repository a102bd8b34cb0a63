"""The seed's config gate: in-process unless MCP_SERVERS (or MCP_ORACLE) says otherwise.

Issue 17, defect 7: setting ``MCP_SERVERS`` alone switched nothing, because only the
catalogue's ``upstream`` entries ever ran over MCP. Now the registry an application
gets (:func:`capgate.adapters.tools.gate.tool_registry`) holds the in-process adapters only,
until the gate is set; then granted tools the catalogue leaves unplaced resolve over
MCP, on the gate's server where a tool of their name was accepted as them, and stay
quarantined until one is. The grant check is the same either way, and comes first.

Real OPA, the test's own MCP server over stdio, the oracle server and the demo.
"""

from __future__ import annotations

import io
import shlex
import sys
from pathlib import Path

import pytest

from capgate import CapabilityViolation, Gateway, StaticCredentials
from capgate.adapters.tools.gate import tool_registry
from capgate.adapters.tools.in_process import InProcessTools
from capgate.demo.oracle_server import oracle_server_spec
from capgate.demo.scenes import run_demo
from capgate.gateway.model.outcomes import Outcome
from tests.integration.mcp_upstream_support import (
    SERVER_SCRIPT,
    Harness,
    contract,
    own_server,
    upstream_tool,
    write_spec,
)

pytestmark = pytest.mark.integration

_SCHEMA = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
#: A catalogue tool that names no upstream: the gate decides where it runs.
UNPLACED = [contract("echo", None, None, input_schema=_SCHEMA, output_schema=_SCHEMA)]


def _spec(tmp_path: Path) -> Path:
    return write_spec(
        tmp_path / "spec.json",
        [upstream_tool("echo", "Echo it.", {"echo": True}, input_schema=_SCHEMA,
                       output_schema=_SCHEMA)],
    )  # fmt: skip


def test_an_unplaced_tool_runs_over_mcp_once_accepted_as_itself(tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    server = own_server("test", _spec(tmp_path), calls=calls)
    with Harness(tmp_path, UNPLACED, [server], unplaced=True) as harness:
        # Never discovered: quarantined like any upstream tool, nothing started.
        assert harness.compose("reader").reasons_for("echo") == ["tool_quarantined"]
        with pytest.raises(CapabilityViolation) as caught:
            harness.gateway.call(harness.request("reader"), "echo", {"message": "x"})
        assert caught.value.reason_codes == ["tool_quarantined"]
        assert not calls.exists()
        harness.discover("test")
        accepted = harness.accept("test", "echo", "echo")  # the catalogue tool of its name
        assert harness.compose("reader").visible == ["echo"]
        answer = harness.gateway.call(harness.request("reader"), "echo", {"message": "hi"})
        assert isinstance(answer, Outcome)
        assert answer.result == {"message": "hi"}
        assert calls.read_text().splitlines() == ['echo {"message": "hi"}']
        rows = [r for r in harness.store.ledger() if r.tool == "echo" and r.kind == "outcome"]
        assert rows[-1].detail["definition"] == accepted.accepted_digest


def test_an_unplaced_tool_accepted_on_two_servers_runs_on_neither(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    servers = [own_server("one", spec), own_server("two", spec)]
    with Harness(tmp_path, UNPLACED, servers, unplaced=True) as harness:
        harness.discover()
        harness.accept("one", "echo", "echo")
        assert harness.compose("reader").visible == ["echo"]
        harness.accept("two", "echo", "echo")  # now ambiguous: which server is it?
        assert harness.compose("reader").reasons_for("echo") == ["tool_quarantined"]


@pytest.mark.parametrize("gate", ["unset", "MCP_SERVERS"])
def test_the_gate_decides_where_an_unplaced_tool_runs(tmp_path: Path, gate: str) -> None:
    calls = tmp_path / "calls.log"
    command = [sys.executable, str(SERVER_SCRIPT), str(_spec(tmp_path)), "--calls", str(calls)]
    environ = {} if gate == "unset" else {"MCP_SERVERS": f"test={shlex.join(command)}"}
    local = InProcessTools()
    harness = Harness(tmp_path, UNPLACED, [])  # for its catalogue, store and OPA
    try:
        with tool_registry(harness.catalogue, harness.store, local, environ=environ) as registry:
            gateway = Gateway(
                harness.catalogue, harness.sidecar.client, registry, harness.store,
                credentials=StaticCredentials({}),
            )  # fmt: skip
            if gate == "unset":  # in-process only: granted, but nothing holds it
                assert registry.adapter_for("echo") is None
                assert gateway.compose(harness.request("reader")).visible == ["echo"]
                return
            # Over MCP: quarantined until accepted, then it runs there.
            assert gateway.compose(harness.request("reader")).visible == []
            registry.adapter_for("echo").discover()  # type: ignore[union-attr]
            code, out = harness.cli(
                "mcp", "accept", "test", "echo", "--as", "echo",
                "--catalogue", str(harness.catalogue_dir), "--by", "maria",
                env=environ,
            )  # fmt: skip
            assert code == 0, out
            answer = gateway.call(harness.request("reader"), "echo", {"message": "gate"})
            assert isinstance(answer, Outcome)
            assert answer.ok
            assert calls.read_text().splitlines() == ['echo {"message": "gate"}']
    finally:
        harness.close()


def test_an_in_process_tool_keeps_its_name_when_the_gate_is_set(tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    command = [sys.executable, str(SERVER_SCRIPT), str(_spec(tmp_path)), "--calls", str(calls)]
    local = InProcessTools()
    local.register("echo", "Echo it, here.", lambda message: {"message": f"local {message}"})
    harness = Harness(tmp_path, UNPLACED, [])
    try:
        environ = {"MCP_SERVERS": f"test={shlex.join(command)}"}
        with tool_registry(harness.catalogue, harness.store, local, environ=environ) as registry:
            assert registry.adapter_for("echo") is local  # registered locally: runs here
    finally:
        harness.close()
    assert not calls.exists()


def test_mcp_servers_alone_switches_the_demos_first_run_to_mcp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = oracle_server_spec()
    monkeypatch.delenv("MCP_ORACLE", raising=False)
    monkeypatch.setenv("MCP_SERVERS", shlex.join(spec.command))  # its id is derived
    out = io.StringIO()
    status = run_demo(out)
    text = out.getvalue()
    assert status == 0, text
    runs = [line for line in text.splitlines() if line.startswith("== oracle-grove")]
    assert len(runs) == 2
    assert "over MCP" in runs[0]
    assert "accepted as catalogue tool oracle" in text


def test_the_gate_unset_keeps_the_demos_first_run_in_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MCP_SERVERS", raising=False)
    monkeypatch.delenv("MCP_ORACLE", raising=False)
    out = io.StringIO()
    assert run_demo(out) == 0, out.getvalue()
    runs = [line for line in out.getvalue().splitlines() if line.startswith("== oracle-grove")]
    assert "in-process" in runs[0]
    assert "over MCP" in runs[1]

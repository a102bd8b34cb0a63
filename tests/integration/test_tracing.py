"""OpenTelemetry traces of a tool call over MCP, with the SDK's in-memory exporter.

The official MCP client calls capgate's MCP server in-process (in a child process of
its own: :mod:`tests.integration.tracing_child`); the MCP SDK opens a span per
``tools/call``; capgate's spans (execute, the tool, the store's transactions) are its
descendants, in the same trace, with the decision id; no exported attribute holds a
parameter value or a secret.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.hang import HANG_SECONDS
from tests.integration.mcp_server_support import ROOT

pytestmark = pytest.mark.integration


def traced_calls(folder: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("CAPGATE_OPA_URL", "CAPGATE_STORE")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.tracing_child", str(folder)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_SECONDS, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def ancestors(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[str]:
    found, parent = [], span["parent"]
    while parent is not None and parent in by_id and parent not in found:
        found.append(parent)
        parent = by_id[parent]["parent"]
    return found


def test_one_trace_per_call_from_the_mcp_span_to_the_tool(tmp_path: Path):
    seen = traced_calls(tmp_path)
    read, denied = seen["outcomes"]
    spans = seen["spans"]
    by_id = {s["id"]: s for s in spans}
    calls = [s for s in spans if s["name"].startswith("tools/call")]
    assert len(calls) == 2, [s["name"] for s in spans]
    for call in calls:
        inside = [s for s in spans if s["trace"] == call["trace"]]
        names = {s["name"] for s in inside}
        assert {"capgate.execute", "capgate.store.transaction"} <= names, names
        [execute] = [s for s in inside if s["name"] == "capgate.execute"]
        assert call["id"] in ancestors(execute, by_id), "capgate.execute is not in tools/call"
    executes = [s for s in spans if s["name"] == "capgate.execute"]
    [ran] = [s for s in executes if s["attributes"].get("capgate.allow") is True]
    assert ran["attributes"]["capgate.decision_id"] == read["decision_id"]
    assert ran["attributes"]["capgate.tool"] == "contact.read"
    assert ran["attributes"]["capgate.status"] == "success"
    assert ran["attributes"]["capgate.bundle_revision"]
    [tool] = [s for s in spans if s["name"] == "capgate.tool"]
    assert tool["parent"] == ran["id"]
    assert tool["attributes"]["capgate.operation_id"] == read["operation_id"]
    [refused] = [s for s in executes if s["attributes"].get("capgate.allow") is False]
    assert list(refused["attributes"]["capgate.reason_codes"]) == denied["reason_codes"]
    assert refused["attributes"]["capgate.decision_id"]
    # No attribute of any span, capgate's or the SDK's, holds a value of the call.
    text = json.dumps([s["attributes"] for s in spans])
    for value in ("c-42", "c-nobody", seen["secret"], "ada@example.test", "Ada Lovelace"):
        assert value not in text, value

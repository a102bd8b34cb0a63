"""``capgate serve --log-format json``: every stderr line is a JSON object, and each
decision's line carries its decision id and the caller's trace id."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tests.hang import HANG_SECONDS
from tests.integration.mcp_server_support import (
    SALES_BOT,
    seed_store,
    stdio_session,
    write_config,
)

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def test_serve_logs_json_lines_with_the_decision_and_trace_ids(tmp_path: Path):
    store = seed_store(tmp_path / "state.db")
    config = write_config(tmp_path / "serve.yaml", stdio=SALES_BOT)
    errlog = tmp_path / "stderr.log"
    record = tmp_path / "record.jsonl"

    async def run() -> tuple[dict, dict]:
        with anyio.fail_after(HANG_SECONDS):
            async with stdio_session(
                store, config, record, errlog, extra=("--log-format", "json")
            ) as client:
                read = await client.call_tool(
                    "contact.read", {"contact_id": "c-42"}, meta={"traceparent": TRACEPARENT}
                )
                denied = await client.call_tool("contact.read", {"contact_id": "c-nobody"})
                return dict(read.meta or {})["capgate/outcome"], dict(denied.meta or {})[
                    "capgate/outcome"
                ]

    read, denied = anyio.run(run)
    lines = [line for line in errlog.read_text(encoding="utf-8").splitlines() if line.strip()]
    # stdio_session runs the server at debug: every line of it, whoever logged it, is JSON
    # (the server's own start-up lines on stderr are printed, not logged: not counted).
    logged = [json.loads(line) for line in lines if line.startswith("{")]
    assert logged, lines
    for line in logged:
        assert {"time", "level", "logger", "event", "message"} <= set(line), line
    decisions = [line for line in logged if line["event"] == "decision"]
    executed = [d for d in decisions if d["question"] == "execute"]
    [mine] = [d for d in executed if d["decision_id"] == read["decision_id"]]
    assert mine["allow"] is True
    assert mine["tool"] == "contact.read"
    assert mine["trace_id"] == TRACE  # the caller's trace, through the MCP SDK's span
    [refused] = [d for d in executed if d["allow"] is False]
    assert refused["reason_codes"] == denied["reason_codes"] == ["subject_out_of_scope"]
    assert "trace_id" not in refused  # that call came without a trace
    # No parameter value reached any line.
    assert "c-42" not in errlog.read_text(encoding="utf-8")
    assert not [line for line in lines if not line.startswith("{") and "capgate." in line]

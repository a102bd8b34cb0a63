"""Counts behind a green integration run, printed at its end for CI's log.

The MCP suites run real processes on both sides (capgate's server under the official
client, real upstream servers from npm and PyPI under capgate's client); a line with
their count makes a run that quietly collected none of them visible.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: Modules whose tests run real MCP processes (capgate serve, upstream servers).
_MCP_MODULES = "test_mcp_"
_passed: dict[str, int] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" or not report.passed:
        return
    path = Path(report.location[0])
    module = path.name
    if path.parent.name == "integration" and module.startswith(_MCP_MODULES):
        _passed[module] = _passed.get(module, 0) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _passed:
        return
    per_module = ", ".join(f"{name} {count}" for name, count in sorted(_passed.items()))
    terminalreporter.write_sep(
        "-",
        f"capgate MCP: {sum(_passed.values())} tests passed against real MCP processes "
        f"({per_module})",
    )

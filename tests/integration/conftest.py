"""The life-cycle suites' shared OPA, and counts behind a green integration run.

The MCP suites run real processes on both sides (capgate's server under the official
client, real upstream servers from npm and PyPI under capgate's client); a line with
their count makes a run that quietly collected none of them visible.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.sidecar import PolicySidecar
from tests.hang import ANSWER_TIMEOUT
from tests.integration.lifecycle_support import write_lifecycle_catalogue


@pytest.fixture(scope="module")
def lifecycle_catalogue_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The life-cycle catalogue (lifecycle_support), written once per module."""
    return write_lifecycle_catalogue(tmp_path_factory.mktemp("catalogue"))


@pytest.fixture(scope="module")
def lifecycle_catalogue(lifecycle_catalogue_dir: Path) -> Catalogue:
    return load_catalogue(lifecycle_catalogue_dir)


@pytest.fixture(scope="module")
def lifecycle_sidecar(lifecycle_catalogue: Catalogue) -> Iterator[PolicySidecar]:
    """An embedded OPA serving it, its answers waited for by the hang bound: the race
    and crash suites load the machine."""
    with PolicySidecar(lifecycle_catalogue, timeout=ANSWER_TIMEOUT) as running:
        yield running


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

"""Print what the fuzz suite ran, so CI's log shows the counts behind a green run."""

from __future__ import annotations

import pytest

from tests.fuzz.runs import RESULTS, atheris_seconds, examples


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    seconds = atheris_seconds()
    atheris = f"{seconds} s per atheris target" if seconds else "atheris by runs"
    terminalreporter.write_sep(
        "-", f"capgate fuzz: {examples()} examples per property, {atheris}, fixed seeds"
    )
    for line in RESULTS:
        terminalreporter.write_line(line)
